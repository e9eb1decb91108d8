// Command ce-receiver is a CloudEvents HTTP receiver for kubesink's HTTP sink tests: every
// request is decoded by the CloudEvents Go SDK (github.com/cloudevents/sdk-go/v2, its HTTP
// protocol binding) and validated; each event is appended to -out as one structured-mode JSON
// line (what `kubesink fold --file` reads). JSON Lines bodies (application/x-ndjson) are
// appended line by line after a JSON check.
//
// Faults on demand, for the next N requests to /: POST /fault with the query
// mode=status&status=429&retry_after=2 (answer that status, with Retry-After when given),
// mode=stall (hold the request without answering until the client gives up), or mode=drop
// (close the connection without an answer). GET /stats answers the counts as JSON; GET
// /healthz answers 200 (or the fault's status while a fault with health=1 is set).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

const batchContentType = "application/cloudevents-batch+json"

type fault struct {
	mode       string
	status     int
	retryAfter string
	count      int
}

type receiver struct {
	mu        sync.Mutex
	out       *os.File
	fault     fault
	requests  int
	events    int
	faulted   int
	rejected  int
	ids       map[string]struct{}
	modes     map[string]int
	lastError string
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	outPath := flag.String("out", "", "file the received events are appended to (JSON Lines)")
	addrFile := flag.String("addr-file", "", "file the bound address is written to once listening")
	certFile := flag.String("tls-cert", "", "serve HTTPS with this certificate (PEM)")
	keyFile := flag.String("tls-key", "", "the certificate's key (PEM)")
	clientCA := flag.String("client-ca", "", "require client certificates signed by this CA (PEM)")
	bearer := flag.String("bearer", "", "require Authorization: Bearer <this>")
	flag.Parse()
	if *outPath == "" {
		log.Fatal("ce-receiver: -out is required")
	}
	out, err := os.OpenFile(*outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("ce-receiver: %v", err)
	}
	r := &receiver{out: out, ids: map[string]struct{}{}, modes: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/fault", r.setFault)
	mux.HandleFunc("/stats", r.stats)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if *bearer != "" && req.Header.Get("Authorization") != "Bearer "+*bearer {
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		r.receive(w, req)
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("ce-receiver: listen %s: %v", *listen, err)
	}
	server := &http.Server{Handler: mux}
	if *clientCA != "" {
		pem, err := os.ReadFile(*clientCA)
		if err != nil {
			log.Fatalf("ce-receiver: %v", err)
		}
		server.TLSConfig = clientAuth(pem)
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
			log.Fatalf("ce-receiver: %v", err)
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			log.Fatalf("ce-receiver: %v", err)
		}
	}
	log.Printf("ce-receiver listening on %s", ln.Addr())
	if *certFile != "" {
		err = server.ServeTLS(ln, *certFile, *keyFile)
	} else {
		err = server.Serve(ln)
	}
	log.Fatalf("ce-receiver: %v", err)
}

func (r *receiver) setFault(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	count, _ := strconv.Atoi(q.Get("count"))
	status, _ := strconv.Atoi(q.Get("status"))
	r.mu.Lock()
	r.fault = fault{mode: q.Get("mode"), status: status, retryAfter: q.Get("retry_after"), count: count}
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) stats(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"requests": r.requests, "events": r.events, "distinct_ids": len(r.ids),
		"faulted": r.faulted, "rejected": r.rejected, "modes": r.modes,
		"fault_left": r.fault.count, "last_error": r.lastError,
	})
}

// takeFault returns the fault to apply to this request, if one is set.
func (r *receiver) takeFault() (fault, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.fault.count <= 0 {
		return fault{}, false
	}
	r.fault.count--
	r.faulted++
	return r.fault, true
}

func (r *receiver) receive(w http.ResponseWriter, req *http.Request) {
	if f, ok := r.takeFault(); ok {
		switch f.mode {
		case "stall":
			<-req.Context().Done() // the client gave up (its timeout) or went away
			return
		case "drop":
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		default:
			if f.retryAfter != "" {
				w.Header().Set("Retry-After", f.retryAfter)
			}
			http.Error(w, fmt.Sprintf("fault injected: %d", f.status), f.status)
			return
		}
	}
	contentType := req.Header.Get("Content-Type")
	var lines [][]byte
	var mode string
	switch {
	case strings.HasPrefix(contentType, "application/x-ndjson"):
		mode = "jsonl"
		body, err := io.ReadAll(req.Body)
		if err != nil {
			r.reject(w, err)
			return
		}
		scanner := bufio.NewScanner(bytes.NewReader(body))
		scanner.Buffer(make([]byte, 1<<20), 64<<20)
		for scanner.Scan() {
			line := bytes.TrimSpace(scanner.Bytes())
			if len(line) == 0 {
				continue
			}
			if !json.Valid(line) {
				r.reject(w, fmt.Errorf("a line is not JSON: %.80s", line))
				return
			}
			lines = append(lines, append([]byte(nil), line...))
		}
	case strings.HasPrefix(contentType, batchContentType):
		mode = "batch"
		events, err := cehttp.NewEventsFromHTTPRequest(req)
		if err != nil {
			r.reject(w, err)
			return
		}
		for i := range events {
			line, err := encode(&events[i])
			if err != nil {
				r.reject(w, err)
				return
			}
			lines = append(lines, line)
		}
	default:
		mode = "binary"
		if strings.HasPrefix(contentType, "application/cloudevents+json") {
			mode = "structured"
		}
		ev, err := cehttp.NewEventFromHTTPRequest(req)
		if err != nil {
			r.reject(w, err)
			return
		}
		line, err := encode(ev)
		if err != nil {
			r.reject(w, err)
			return
		}
		lines = append(lines, line)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var buf bytes.Buffer
	for _, line := range lines {
		buf.Write(line)
		buf.WriteByte('\n')
		var id struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(line, &id)
		r.ids[id.ID] = struct{}{}
	}
	if _, err := r.out.Write(buf.Bytes()); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	r.events += len(lines)
	r.modes[mode] += len(lines)
	w.WriteHeader(http.StatusAccepted)
}

// encode validates an event (the SDK's rules for every attribute) and writes it in the JSON
// event format (structured mode), data included as JSON.
func encode(ev *event.Event) ([]byte, error) {
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("invalid event %q: %w", ev.ID(), err)
	}
	return json.Marshal(ev)
}

func (r *receiver) reject(w http.ResponseWriter, err error) {
	r.mu.Lock()
	r.rejected++
	r.lastError = err.Error()
	r.mu.Unlock()
	log.Printf("ce-receiver: rejected a request: %v", err)
	http.Error(w, err.Error(), http.StatusBadRequest)
}
