// Command peer-informer follows every Pod of a cluster the way kubesink's Go peers do, so
// that `bench-suite --only peers` can measure them beside kubesink on the same real API
// server. One program, four techniques (--mode):
//
//   - full: client-go's shared informer over typed Pods (informers.NewSharedInformerFactory),
//     its cache holding every whole object: what most watchers and exporters run;
//   - metadata: client-go's metadata-only informer (metadatainformer), its cache holding
//     PartialObjectMetadata (metadata.* of each object, no spec or status);
//   - clutch: the seed's technique as Lyft Clutch writes it for Pods, rebuilt here line for
//     line on client-go because the module proxy does not serve github.com/lyft/clutch/backend
//     (see clutch below): NewLightweightInformer (backend/service/k8s/lightweightinformer.go)
//     over the ListWatch that startInformers (backend/service/k8s/cache.go) builds with
//     cache.NewListWatchFromClient on the clientset's RESTClient, which asks for JSON; and
//     for Pods recieveUpdates is false, so a change to a Pod already known is dropped;
//   - lightweight: the seed's technique improved: the same store of names and namespaces,
//     but listed and watched through the typed clientset (protobuf) and every update handed
//     on (without the old object, as Clutch's update handler gets it).
//
// Every client is client-go's default for its kind: the typed clientset (full, lightweight)
// asks for protobuf, the metadata client for protobuf PartialObjectMetadata, the clientset's
// bare RESTClient (clutch) for JSON.
//
// Every event is handed to a handler that serializes the object to JSON (what a bridge to a
// broker does before it sends; --encode=false skips it) and appends one line to --out:
// "op<TAB>namespace/name<TAB>uid<TAB>resourceVersion<TAB>stamp<TAB>handled", op one of added,
// updated, deleted; stamp the object's bench.kubesink.io/changed-at annotation (the churn's
// write time in Unix microseconds, "-" when absent) and handled the time the handler ran
// (Unix microseconds), so the driver can take change → delivered latencies from the file.
// A delete seen only as a tombstone after a relist (cache.DeletedFinalStateUnknown) is
// unwrapped and written too, in every mode: the peers get the benefit of the doubt.
//
// Standard output carries status lines for the driver: "synced N" once the initial list
// has been handed to the handler (N events so far), "events N" at exit (SIGTERM or SIGINT),
// after --out was flushed. Nothing is saved between runs: none of these techniques has a
// saved state, so a restart lists everything again.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// stampAnnotation is the annotation the bench suite's churn writes its change time into
// (Unix microseconds; kubesink_bench::procs::STAMP).
const stampAnnotation = "bench.kubesink.io/changed-at"

// sink is the handler's destination: the --out file and the JSON encoder.
type sink struct {
	mu     sync.Mutex
	out    *bufio.Writer
	encode bool
	events atomic.Int64
}

func (s *sink) emit(op string, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peer-informer: %s of a %T without metadata: %v\n", op, obj, err)
		return
	}
	if s.encode {
		if err := json.NewEncoder(io.Discard).Encode(obj); err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: encoding %s/%s: %v\n", m.GetNamespace(), m.GetName(), err)
		}
	}
	stamp, ok := m.GetAnnotations()[stampAnnotation]
	if !ok {
		stamp = "-"
	}
	handled := time.Now().UnixMicro()
	s.mu.Lock()
	fmt.Fprintf(s.out, "%s\t%s/%s\t%s\t%s\t%s\t%d\n", op, m.GetNamespace(), m.GetName(), m.GetUID(), m.GetResourceVersion(), stamp, handled)
	s.mu.Unlock()
	s.events.Add(1)
}

func (s *sink) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Flush()
}

func (s *sink) handler() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.emit("added", obj) },
		UpdateFunc: func(_, obj any) { s.emit("updated", obj) },
		DeleteFunc: func(obj any) { s.emit("deleted", obj) },
	}
}

// lightweight builds the seed's technique improved: the controller's store holds an
// ObjectMeta with the name and namespace alone, the DeltaFIFO compares against it to infer
// deletes on relist, as in Clutch (see clutch); unlike Clutch's Pod informer it lists and
// watches through the typed client and hands every update on.
func lightweight(cs kubernetes.Interface, s *sink) cache.Controller {
	// Through the typed client, not the ListWatch Clutch builds on the bare RESTClient
	// (cache.NewListWatchFromClient, JSON): client-go's typed clients ask for protobuf,
	// which the API server encodes far more cheaply than JSON.
	pods := cs.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, opts)
		},
	}
	store := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{KnownObjects: store, EmitDeltaTypeReplaced: true})
	return cache.New(&cache.Config{
		Queue:         fifo,
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Process: func(obj any, _ bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("not deltas: %T", obj)
			}
			for _, d := range deltas {
				object := d.Object
				if tomb, ok := object.(cache.DeletedFinalStateUnknown); ok {
					object = tomb.Obj
				}
				m, err := meta.Accessor(object)
				if err != nil {
					return err
				}
				light := &metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace()}
				switch d.Type {
				case cache.Sync, cache.Replaced, cache.Added, cache.Updated:
					if _, exists, err := store.Get(light); err == nil && exists {
						if err := store.Update(light); err != nil {
							return err
						}
						s.emit("updated", d.Object)
					} else {
						if err := store.Add(light); err != nil {
							return err
						}
						s.emit("added", d.Object)
					}
				case cache.Deleted:
					if err := store.Delete(light); err != nil {
						return err
					}
					s.emit("deleted", d.Object)
				}
			}
			return nil
		},
	})
}

// clutchClusterLabel is the label Clutch's informer merges into every object it hands on
// (clutchLabelClusterName, backend/service/k8s/kube_cluster.go).
const clutchClusterLabel = "cluster.clutch.sh/name"

// lightweightCacheObject is Clutch's store entry (backend/service/k8s/lightweightinformer.go):
// a metav1.Object left nil but for the name and namespace the key function asks for.
type lightweightCacheObject struct {
	metav1.Object
	Name      string
	Namespace string
}

func (lw *lightweightCacheObject) GetName() string      { return lw.Name }
func (lw *lightweightCacheObject) GetNamespace() string { return lw.Namespace }

// GetResourceVersion is not in Clutch (written against client-go v0.30.1): client-go v0.37's
// store reads the resourceVersion of each object it adds (threadSafeMap.Update, for a
// metric), which on Clutch's struct calls the nil metav1.Object and panics (the first try of
// this mode did). It keeps none, as Clutch's struct keeps none.
func (lw *lightweightCacheObject) GetResourceVersion() string { return "" }

// clutch is Lyft Clutch's Pod informer as written (github.com/lyft/clutch at a6d39b3d,
// backend/service/k8s):
//
//   - the ListWatch: startInformers (cache.go) builds
//     cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", corev1.NamespaceAll,
//     fields.Everything()), cs the typed clientset of k8s.NewForConfig(restConfig)
//     (clientset.go, newClientsetManager) with no ContentType set: the bare RESTClient's
//     requests ask for application/json (the typed Pods client would ask for protobuf; the
//     RESTClient under it does not), as here;
//   - the informer: NewLightweightInformer(lwPod, &corev1.Pod{}, informerHandlers, false,
//     clusterName) (lightweightinformer.go): a cache.New controller, FullResyncPeriod 0,
//     RetryOnError false, a DeltaFIFO (EmitDeltaTypeReplaced) whose KnownObjects is an
//     indexer of lightweightCacheObject; Process merges the cluster label into the object,
//     then for Sync, Replaced, Added and Updated adds an unknown name and calls OnAdd, and
//     for a known one does nothing because recieveUpdates is false for Pods ("This both
//     disables the cache update and the OnUpdate handler"); for Deleted it removes the
//     name and calls OnDelete;
//   - the handlers (informerAddHandler, informerUpdateHandler, informerDeleteHandler in
//     cache.go) turn the object into Clutch's own proto and send it down a channel; here
//     the bench's sink serializes it to JSON instead, as every peer does. Clutch's
//     deployments, HPAs and nodes get the same informer with updates on; they are not Pods
//     and are left out, as is cacheFullRelist, a full list every half cache TTL (1 h by
//     default), longer than any run of the bench.
//
// Like every peer here it runs on client-go v0.37.2, the control plane's release, with its
// defaults: its reflector opens the initial list as a streaming watch list (WatchListClient,
// on by default since v0.35), where Clutch's v0.30.1 made a LIST and then a WATCH.
//
// One difference, the benefit of the doubt every mode gets: a tombstone
// (cache.DeletedFinalStateUnknown, a delete inferred on relist) is unwrapped here, where
// Clutch's meta.Accessor fails on it and the error is dropped by RetryOnError false.
func clutch(cs kubernetes.Interface, clusterName string, s *sink) cache.Controller {
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", corev1.NamespaceAll, fields.Everything())
	const recieveUpdates = false // NewLightweightInformer's argument for Pods in startInformers
	cacheStore := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{
		KnownObjects:          cacheStore,
		EmitDeltaTypeReplaced: true,
	})
	h := s.handler()
	return cache.New(&cache.Config{
		Queue:            fifo,
		ListerWatcher:    lw,
		ObjectType:       &corev1.Pod{},
		FullResyncPeriod: 0,
		// RetryOnError: false in Clutch; client-go v0.37 has dropped the field, and an
		// error from Process is dropped with it.
		Process: func(obj any, isInInitialList bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("not deltas: %T", obj)
			}
			for _, d := range deltas {
				object := d.Object
				if tomb, ok := object.(cache.DeletedFinalStateUnknown); ok {
					object = tomb.Obj
					// What the store knew: a lightweightCacheObject, whose nil
					// metav1.Object the sink's accessors cannot call.
					if light, ok := object.(*lightweightCacheObject); ok {
						object = &metav1.ObjectMeta{Name: light.Name, Namespace: light.Namespace}
					}
				}
				incomingObjectMeta, err := meta.Accessor(object)
				if err != nil {
					return err
				}
				lightweightObj := &lightweightCacheObject{
					Name:      incomingObjectMeta.GetName(),
					Namespace: incomingObjectMeta.GetNamespace(),
				}
				incomingObjectMeta.SetLabels(labels.Merge(incomingObjectMeta.GetLabels(), labels.Set{
					clutchClusterLabel: clusterName,
				}))
				switch d.Type {
				case cache.Sync, cache.Replaced, cache.Added, cache.Updated:
					if _, exists, err := cacheStore.Get(lightweightObj); err == nil && exists {
						if recieveUpdates {
							if err := cacheStore.Update(lightweightObj); err != nil {
								return err
							}
							h.OnUpdate(nil, d.Object)
						}
					} else {
						if err := cacheStore.Add(lightweightObj); err != nil {
							return err
						}
						h.OnAdd(d.Object, isInInitialList)
					}
				case cache.Deleted:
					if err := cacheStore.Delete(lightweightObj); err != nil {
						return err
					}
					h.OnDelete(object)
				default:
					return fmt.Errorf("Cache type not supported: %s", d.Type)
				}
			}
			return nil
		},
	})
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	mode := flag.String("mode", "full", "full | metadata | clutch | lightweight")
	outPath := flag.String("out", "", "file the events are appended to (required)")
	encode := flag.Bool("encode", true, "serialize each event's object to JSON, as a bridge does")
	flag.Parse()
	if *kubeconfig == "" || *outPath == "" {
		fmt.Fprintln(os.Stderr, "peer-informer: --kubeconfig and --out are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peer-informer: kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	// The client's defaults (5 QPS, 10 burst) do not matter to one list and one watch.
	f, err := os.Create(*outPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peer-informer: --out %s: %v\n", *outPath, err)
		os.Exit(2)
	}
	s := &sink{out: bufio.NewWriterSize(f, 1<<16), encode: *encode}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var synced func() bool
	switch *mode {
	case "full":
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		factory := informers.NewSharedInformerFactory(cs, 0)
		reg, err := factory.Core().V1().Pods().Informer().AddEventHandler(s.handler())
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		factory.Start(ctx.Done())
		synced = reg.HasSynced
	case "metadata":
		mc, err := metadata.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		factory := metadatainformer.NewSharedInformerFactory(mc, 0)
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
		reg, err := factory.ForResource(gvr).Informer().AddEventHandler(s.handler())
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		factory.Start(ctx.Done())
		synced = reg.HasSynced
	case "clutch":
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		c := clutch(cs, "bench", s)
		go c.Run(ctx.Done())
		synced = c.HasSynced
	case "lightweight":
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer-informer: %v\n", err)
			os.Exit(2)
		}
		c := lightweight(cs, s)
		go c.Run(ctx.Done())
		synced = c.HasSynced
	default:
		fmt.Fprintf(os.Stderr, "peer-informer: --mode %q: full, metadata, clutch or lightweight\n", *mode)
		os.Exit(2)
	}

	// The status line once the initial list reached the handler; the file flushed often, so
	// the driver can count what arrived while the program runs.
	go func() {
		for !synced() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		fmt.Printf("synced %d\n", s.events.Load())
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := s.flush(); err != nil {
				fmt.Fprintf(os.Stderr, "peer-informer: writing %s: %v\n", *outPath, err)
				os.Exit(1)
			}
			fmt.Printf("events %d\n", s.events.Load())
			return
		case <-tick.C:
			if err := s.flush(); err != nil {
				fmt.Fprintf(os.Stderr, "peer-informer: writing %s: %v\n", *outPath, err)
				os.Exit(1)
			}
		}
	}
}
