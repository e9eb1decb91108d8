//! A real Kubernetes control plane for the real-server tests: etcd, kube-apiserver and
//! kube-controller-manager, built from their own Go modules (`tests/kube/`, pinned there) by
//! `scripts/kube-build.sh` into the tools cache, started here on free ports.
//!
//! The flags follow controller-runtime's envtest (`pkg/internal/testing/controlplane`) and
//! Kubernetes' own `cmd/kube-apiserver/app/testing` (`StartTestServer`), plus what the tests
//! need a real cluster for: TLS with a CA of the test's own (openssl), client certificates
//! (an admin in `system:masters`), `--authorization-mode=Node,RBAC`, service-account token
//! signing (tokens from the TokenRequest API for restricted kubeconfigs) and the
//! controller-manager (Deployments create ReplicaSets and Pods, the garbage collector
//! cascades deletes, namespace deletion finishes). No kubelet and no scheduler: Pods stay
//! Pending, which is all a watcher of topology needs.
//!
//! One etcd per test binary; one shared API server (with the controller-manager) per binary
//! from [`shared`], and further API servers on the same etcd under their own key prefix
//! ([`ControlPlane::start`], e.g. with a feature gate off), killed on drop. Every process is
//! started from one long-lived thread with `PR_SET_PDEATHSIG`, so none outlives the test
//! binary. It uses nothing of this crate but `ports.rs`: the benchmark suite
//! (`benches/suite`) includes the two files by path.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::ports::free_port;

/// How long a component gets to become ready (a cold machine, two cores shared).
const READY_WITHIN: Duration = Duration::from_secs(180);

/// The directory holding `etcd`, `kube-apiserver` and `kube-controller-manager` (not
/// `KUBESINK_…`: kubesink reads every such variable as configuration, in tests too):
/// `KUBE_TEST_BIN_DIR`, else what `scripts/kube-build.sh` prints (it builds when needed).
pub fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        built_dir(
            "KUBE_TEST_BIN_DIR",
            "scripts/kube-build.sh",
            "the real-server tests need Go and the module proxy (docs/testing.md)",
        )
    })
    .clone()
}

/// A directory of tools a build script makes: `$env_var` when set, else what `script`
/// prints (found in this crate's root or an ancestor of it: the benchmark suite,
/// `benches/suite`, includes this file too), building when needed; panics with `need` when
/// the script fails.
pub fn built_dir(env_var: &str, script: &str, need: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(env_var) {
        return PathBuf::from(dir);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join(script))
        .find(|s| s.is_file())
        .unwrap_or_else(|| PathBuf::from(script));
    let out = Command::new(&path)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(out.status.success(), "{} failed: {need}", path.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A Deployment the ReplicaSet controller fills with `replicas` Pods of `image`. No kubelet
/// runs here, so no Pod ever becomes ready: a rolling update would wait for one forever;
/// Recreate rolls out without it.
pub fn deployment(ns: &str, name: &str, replicas: i32, image: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }
        }
    })
}

/// A ConfigMap `name` in `ns` holding `data`.
pub fn configmap(ns: &str, name: &str, data: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns}, "data": data})
}

/// Merges `data` into the data of ConfigMap `name` in `ns` (a [`patch`]).
pub async fn patch_configmap(client: &kube::Client, ns: &str, name: &str, data: serde_json::Value) {
    let data = serde_json::json!({ "data": data });
    patch(client, "v1", "ConfigMap", Some(ns), name, data).await
}

/// Spawns processes from one thread that lives as long as the test binary, each with
/// `PR_SET_PDEATHSIG` = SIGKILL: the kernel kills them when that thread (so the binary) ends,
/// however it ends. (The signal follows the spawning thread, not the process: a test's own
/// thread would take them down with it.)
fn spawn(cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                    unsafe {
                        cmd.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
                // Keep the thread (the children's parent) alive until the binary exits.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .expect("spawner thread alive");
    rx.recv().expect("spawner thread alive")
}

/// A started process whose output goes to `log`.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(name: &'static str, bin: &Path, args: &[String], log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().expect("log file")))
            .stderr(Stdio::from(file));
        let child = spawn(cmd).unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        Proc { name, child, log }
    }

    /// Panics (with its log's tail) if it exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, tail(&self.log, 40));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until `ready` holds, checking that `procs` still run; panics naming `what`.
fn wait_ready(what: &str, procs: &mut [&mut Proc], mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        for p in procs.iter_mut() {
            p.assert_running();
        }
        if ready() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready within {READY_WITHIN:?}:\n{}",
            procs
                .iter()
                .map(|p| format!("--- {}:\n{}", p.name, tail(&p.log, 30)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `openssl args` in `dir`; panics with its stderr when it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The certificates and keys of one test PKI, in a directory:
/// `ca.crt`/`ca.key`, `apiserver.crt`/`.key` (SAN 127.0.0.1, localhost, the Service IP),
/// `admin.crt`/`.key` (`O=system:masters`), `sa.key`/`sa.pub` (service-account signing).
pub struct Pki {
    /// The directory holding the files.
    pub dir: PathBuf,
}

impl Pki {
    fn generate(dir: &Path) -> Pki {
        let run = |args: &[&str]| openssl(dir, args);
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=kubesink-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ]);
        run(&ca);
        for (name, subject, ext) in [
            (
                "apiserver",
                "/CN=kube-apiserver",
                "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
            ),
            (
                "admin",
                "/O=system:masters/CN=kubesink-test-admin",
                "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
            ),
        ] {
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
            let key = format!("{name}.key");
            let csr = format!("{name}.csr");
            let mut req = vec!["req", "-nodes"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
            run(&req);
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.crt"),
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        run(&["genrsa", "-out", "sa.key", "2048"]);
        run(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn pem(&self, name: &str) -> String {
        use base64::Engine;
        let bytes = std::fs::read(self.dir.join(name)).expect("pem file");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}

/// A temporary directory for a server that lives as long as the test binary (the binary's
/// etcd, its shared control plane): kept in a `static`, its [`tempfile::TempDir`] is never
/// dropped, so it is made under `$TMPDIR/kubesink-tests/` named after this process, and the
/// directories of processes that have exited are removed first. Without the sweep every test
/// binary run left its etcd data behind (100–400 MB each), enough to fill a CI disk.
pub fn process_tempdir(what: &str) -> tempfile::TempDir {
    let root = std::env::temp_dir().join("kubesink-tests");
    std::fs::create_dir_all(&root).expect("create $TMPDIR/kubesink-tests");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_string_lossy()
                .split('.')
                .next()
                .unwrap_or("")
                .to_owned();
            let alive = pid
                .parse::<u32>()
                .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    tempfile::Builder::new()
        .prefix(&format!("{}.{what}.", std::process::id()))
        .tempdir_in(&root)
        .expect("tempdir under $TMPDIR/kubesink-tests")
}

/// The etcd of this test binary.
struct Etcd {
    proc: Proc,
    url: String,
    _dir: tempfile::TempDir,
}

fn etcd() -> &'static Mutex<Etcd> {
    static ETCD: OnceLock<Mutex<Etcd>> = OnceLock::new();
    ETCD.get_or_init(|| {
        let dir = process_tempdir("etcd");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args: Vec<String> = [
            "--name=default".to_owned(),
            format!("--data-dir={}", dir.path().join("data").display()),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // A test cluster: durability across a machine crash is not what is tested.
            "--unsafe-no-fsync=true".to_owned(),
            "--quota-backend-bytes=8589934592".to_owned(),
            "--log-level=warn".to_owned(),
        ]
        .into();
        let mut proc = Proc::start(
            "etcd",
            &bin_dir().join("etcd"),
            &args,
            dir.path().join("etcd.log"),
        );
        let addr: SocketAddr = ([127, 0, 0, 1], client).into();
        wait_ready("etcd", &mut [&mut proc], || {
            http_get_plain(addr, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
        });
        Mutex::new(Etcd {
            proc,
            url,
            _dir: dir,
        })
    })
}

/// The client URL of the binary's etcd (`http://127.0.0.1:PORT`), and its address.
fn etcd_url() -> String {
    etcd().lock().unwrap_or_else(|p| p.into_inner()).url.clone()
}

fn etcd_addr() -> SocketAddr {
    etcd_url()
        .trim_start_matches("http://")
        .parse()
        .expect("etcd addr")
}

/// A plain-HTTP GET on loopback (etcd's `/health`, its JSON gateway); the body, or `None`.
fn http_get_plain(addr: SocketAddr, path: &str) -> Option<String> {
    http_plain(addr, "GET", path, "")
}

fn http_plain(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        conn,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

/// What a control plane is started with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--feature-gates` of the API server, e.g. `["WatchList=false"]`.
    pub feature_gates: Vec<String>,
    /// More API server flags.
    pub apiserver_args: Vec<String>,
    /// Run a kube-controller-manager beside it.
    pub controller_manager: bool,
}

/// A running API server (and, with [`Options::controller_manager`], a controller manager)
/// on the binary's etcd.
pub struct ControlPlane {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// A kubeconfig of a `system:masters` user.
    pub admin_kubeconfig: PathBuf,
    /// The PKI its certificates come from.
    pub pki: Pki,
    /// The key prefix of this API server in etcd (`/registry-…`).
    pub etcd_prefix: String,
    procs: Mutex<Vec<Proc>>,
    options: Options,
    dir: tempfile::TempDir,
}

/// [`shared`], from async code (the start blocks: it runs on a blocking thread).
pub async fn shared_async() -> &'static ControlPlane {
    tokio::task::spawn_blocking(shared)
        .await
        .expect("control plane start")
}

/// The binary's shared control plane (API server and controller manager, defaults), started
/// on first use.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    SHARED.get_or_init(|| {
        ControlPlane::start_in(
            process_tempdir("control-plane"),
            Options {
                controller_manager: true,
                ..Default::default()
            },
        )
    })
}

impl ControlPlane {
    /// Starts an API server with `options` on the binary's etcd (started if needed) under a
    /// key prefix of its own, and waits until `/readyz` answers 200 (and, with a controller
    /// manager, until it created the `default` ServiceAccount of `default`).
    pub fn start(options: Options) -> ControlPlane {
        Self::start_in(tempfile::tempdir().expect("tempdir"), options)
    }

    /// [`ControlPlane::start`] with its certificates, kubeconfigs and logs in `dir`.
    fn start_in(dir: tempfile::TempDir, options: Options) -> ControlPlane {
        let pki = Pki::generate(dir.path());
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &url,
            &pki.pem("ca.crt"),
            User::Cert {
                cert: pki.pem("admin.crt"),
                key: pki.pem("admin.key"),
            },
        );
        let etcd_prefix = format!("/registry-{port}");
        let cp = ControlPlane {
            url,
            port,
            admin_kubeconfig,
            pki,
            etcd_prefix,
            procs: Mutex::new(Vec::new()),
            options,
            dir,
        };
        cp.start_apiserver();
        if cp.options.controller_manager {
            cp.start_controller_manager();
            cp.wait_service_account("default", "default");
        }
        cp
    }

    fn apiserver_args(&self) -> Vec<String> {
        let servers = etcd_url();
        let issuer = "https://kubernetes.default.svc.cluster.local";
        let mut args: Vec<String> = vec![
            format!("--etcd-servers={servers}"),
            format!("--etcd-prefix={}", self.etcd_prefix),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.port),
            format!("--tls-cert-file={}", self.pki.path("apiserver.crt")),
            format!("--tls-private-key-file={}", self.pki.path("apiserver.key")),
            format!("--client-ca-file={}", self.pki.path("ca.crt")),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-account-issuer={issuer}"),
            format!("--api-audiences={issuer}"),
            format!("--service-account-key-file={}", self.pki.path("sa.pub")),
            format!(
                "--service-account-signing-key-file={}",
                self.pki.path("sa.key")
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            // The `kubernetes` Service's endpoints name no real node here.
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", self.dir.path().join("certs").display()),
            "--v=1".into(),
        ];
        if !self.options.feature_gates.is_empty() {
            args.push(format!(
                "--feature-gates={}",
                self.options.feature_gates.join(",")
            ));
        }
        args.extend(self.options.apiserver_args.iter().cloned());
        args
    }

    fn start_apiserver(&self) {
        let mut proc = Proc::start(
            "kube-apiserver",
            &bin_dir().join("kube-apiserver"),
            &self.apiserver_args(),
            self.dir.path().join("kube-apiserver.log"),
        );
        let kubeconfig = self.admin_kubeconfig.clone();
        wait_ready("kube-apiserver", &mut [&mut proc], || {
            let kubeconfig = kubeconfig.clone();
            block_on(async move {
                let Ok(client) = client_of(&kubeconfig).await else {
                    return false;
                };
                let req = http::Request::get("/readyz").body(Vec::new());
                match req {
                    Ok(req) => client.request_text(req).await.is_ok_and(|t| t == "ok"),
                    Err(_) => false,
                }
            })
        });
        self.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(proc);
    }

    fn start_controller_manager(&self) {
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.path("sa.key")
            ),
            format!("--root-ca-file={}", self.pki.path("ca.crt")),
            "--use-service-account-credentials=false".into(),
            // Quick garbage collection and namespace deletion for the tests.
            "--concurrent-gc-syncs=10".into(),
            "--namespace-sync-period=10s".into(),
            "--v=1".into(),
        ];
        let proc = Proc::start(
            "kube-controller-manager",
            &bin_dir().join("kube-controller-manager"),
            &args,
            self.dir.path().join("kube-controller-manager.log"),
        );
        self.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(proc);
    }

    /// Waits until the ServiceAccount `namespace/name` exists (the controller manager makes
    /// `default` in every namespace; Pods are refused until it does).
    pub fn wait_service_account(&self, namespace: &str, name: &str) {
        let kubeconfig = self.admin_kubeconfig.clone();
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        let mut refs: Vec<&mut Proc> = procs.iter_mut().collect();
        wait_ready(
            &format!("ServiceAccount {namespace}/{name}"),
            &mut refs,
            || {
                let (kubeconfig, namespace, name) =
                    (kubeconfig.clone(), namespace.to_owned(), name.to_owned());
                block_on(async move {
                    let Ok(client) = client_of(&kubeconfig).await else {
                        return false;
                    };
                    let api: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
                        kube::Api::namespaced(client, &namespace);
                    api.get_opt(&name).await.is_ok_and(|sa| sa.is_some())
                })
            },
        );
    }

    /// A kube client of the admin user.
    pub async fn admin(&self) -> kube::Client {
        client_of(&self.admin_kubeconfig)
            .await
            .expect("admin client")
    }

    /// A kubeconfig for ServiceAccount `namespace/name` (created when missing) with a token
    /// from the TokenRequest API (one hour), written in `dir`.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        dir: &Path,
    ) -> PathBuf {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        use kube::api::{Api, PostParams};
        let client = self.admin().await;
        let sas: Api<ServiceAccount> = Api::namespaced(client, namespace);
        if sas.get_opt(name).await.expect("get sa").is_none() {
            let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": namespace}
            }))
            .expect("sa");
            sas.create(&PostParams::default(), &sa)
                .await
                .expect("create sa");
        }
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec!["https://kubernetes.default.svc.cluster.local".into()]),
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = sas
            .create_token_request(name, &PostParams::default(), &req)
            .await
            .expect("TokenRequest")
            .status
            .expect("token status")
            .token
            .expect("a token");
        let path = dir.join(format!("{namespace}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.url,
            &self.pki.pem("ca.crt"),
            User::Token(token),
        );
        path
    }

    /// Writes a kubeconfig at `path` of the admin user, reaching the API server at `addr` (a
    /// proxy in front of it: `proxy.rs`), the server's name checked against its CA as usual.
    pub fn write_admin_kubeconfig_via(&self, path: &Path, addr: std::net::SocketAddr) {
        let pem = |name: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .encode(std::fs::read(self.pki.dir.join(name)).expect("pem"))
        };
        write_kubeconfig(
            path,
            &format!("https://{addr}"),
            &pem("ca.crt"),
            User::Cert {
                cert: pem("admin.crt"),
                key: pem("admin.key"),
            },
        );
    }

    /// The API server's `/metrics` (admin), as text.
    pub async fn metrics(&self) -> String {
        let client = self.admin().await;
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        client.request_text(req).await.expect("/metrics")
    }

    /// The sum of the samples of metric `name` (a counter or gauge of the API server's
    /// `/metrics`) whose labels include every `labels` pair.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.metrics().await;
        let mut sum = 0.0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            let (labels_text, value) = match rest.strip_prefix('{') {
                Some(r) => match r.rsplit_once("} ") {
                    Some(x) => x,
                    None => continue,
                },
                None if rest.starts_with(' ') => ("", rest.trim()),
                None => continue,
            };
            if labels
                .iter()
                .all(|(k, v)| labels_text.contains(&format!("{k}=\"{v}\"")))
            {
                sum += value.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        sum
    }

    /// `apiserver_request_total` summed by verb for `resource` (e.g. `pods`), `group` `""`
    /// for the core group: how many LIST, WATCH... requests the API server served.
    pub async fn requests_by_verb(&self, group: &str, resource: &str) -> BTreeMap<String, f64> {
        let text = self.metrics().await;
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                let end = labels[start..].find('"')? + start;
                Some(labels[start..end].to_owned())
            };
            if label("resource").as_deref() != Some(resource)
                || label("group").as_deref().unwrap_or("") != group
            {
                continue;
            }
            let verb = label("verb").unwrap_or_default();
            *out.entry(verb).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        out
    }

    /// etcd's current revision (its JSON gateway).
    pub fn etcd_revision(&self) -> i64 {
        let addr = etcd_addr();
        // A range over one key ("/" in base64) returns the header with the revision.
        let body =
            http_plain(addr, "POST", "/v3/kv/range", r#"{"key":"Lw=="}"#).expect("etcd range");
        let v: serde_json::Value = serde_json::from_str(&body).expect("etcd JSON");
        v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("revision")
    }

    /// Compacts etcd up to its current revision (what the API server does every
    /// `--etcd-compaction-interval`): a watch or list at an older resourceVersion that
    /// reaches etcd gets 410 Gone. Returns the revision.
    pub fn compact_etcd(&self) -> i64 {
        let revision = self.etcd_revision();
        let addr = etcd_addr();
        http_plain(
            addr,
            "POST",
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .expect("etcd compaction");
        revision
    }

    /// Stops the API server (SIGKILL) and starts it again with the same flags (the same
    /// port, certificates and etcd data): its watch cache starts empty.
    pub fn restart_apiserver(&self) {
        {
            let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = procs.iter_mut().find(|p| p.name == "kube-apiserver") {
                p.kill();
            }
            procs.retain(|p| p.name != "kube-apiserver");
        }
        self.start_apiserver();
    }

    /// The process id of a component (`kube-apiserver`, `kube-controller-manager`), while it
    /// runs; `etcd` is the binary's etcd, shared by every API server.
    pub fn pid(&self, name: &str) -> Option<u32> {
        if name == "etcd" {
            return Some(
                etcd()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .proc
                    .child
                    .id(),
            );
        }
        self.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.child.id())
    }

    /// A component's log.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for p in self
            .procs
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
        {
            p.kill();
        }
    }
}

/// Who a kubeconfig authenticates as.
pub enum User {
    /// A client certificate and key (base64 PEM).
    Cert {
        /// The certificate.
        cert: String,
        /// Its private key.
        key: String,
    },
    /// A bearer token.
    Token(String),
}

/// Writes a kubeconfig for `server` with CA `ca` (base64 PEM) and `user`.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &str, user: User) {
    let user = match user {
        User::Cert { cert, key } => serde_json::json!({
            "client-certificate-data": cert, "client-key-data": key
        }),
        User::Token(token) => serde_json::json!({ "token": token }),
    };
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
        "current-context": "real",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&kc).expect("json")).expect("kubeconfig");
}

/// A kube client of a kubeconfig file.
pub async fn client_of(path: &Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Runs a future to completion on a runtime of its own (the waits above run on plain
/// threads, possibly inside a test's runtime: a fresh thread keeps the two apart).
fn block_on<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    })
    .join()
    .expect("block_on thread")
}

/// `(kind, namespace, name)` → `(uid, resourceVersion)`: an exact state, as the API server
/// lists it and as a consumer's fold holds it (`oracle::UidFold`, the same type).
pub type State = BTreeMap<(String, String, String), (String, String)>;

/// The API resource of `api_version`/`kind`, from the server's discovery.
pub async fn api_resource(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
) -> kube::discovery::ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovery of {api_version} {kind}: {e}"))
        .0
}

/// A dynamic API of `api_version`/`kind` in `namespace` (`None`: all namespaces, or a
/// cluster-scoped kind).
pub async fn dynamic(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> kube::Api<kube::api::DynamicObject> {
    let ar = api_resource(client, api_version, kind).await;
    match namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &ar),
        None => kube::Api::all_with(client.clone(), &ar),
    }
}

/// Creates `object` (its `apiVersion`, `kind` and `metadata.namespace` say where).
pub async fn create(client: &kube::Client, object: serde_json::Value) -> kube::api::DynamicObject {
    let api = object["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .to_owned();
    let kind = object["kind"].as_str().expect("kind").to_owned();
    let ns = object["metadata"]["namespace"].as_str().map(str::to_owned);
    let obj: kube::api::DynamicObject = serde_json::from_value(object).expect("object");
    dynamic(client, &api, &kind, ns.as_deref())
        .await
        .create(&Default::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {:?}: {e}", obj.metadata.name))
}

/// Merge-patches `namespace/name` of `api_version`/`kind` with `patch`.
pub async fn patch(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    patch: serde_json::Value,
) {
    dynamic(client, api_version, kind, namespace)
        .await
        .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("patch {kind} {name}: {e}"));
}

/// Deletes `namespace/name` of `api_version`/`kind` (background propagation: the garbage
/// collector deletes what it owns).
pub async fn delete(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) {
    dynamic(client, api_version, kind, namespace)
        .await
        .delete(name, &kube::api::DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("delete {kind} {name}: {e}"));
}

/// Creates namespace `name` and waits for its `default` ServiceAccount (Pods are refused
/// before it exists).
pub async fn namespace(cp: &'static ControlPlane, name: &str, labels: serde_json::Value) {
    let client = cp.admin().await;
    create(
        &client,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}}),
    )
    .await;
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || cp.wait_service_account(&name, "default"))
        .await
        .expect("wait for the default ServiceAccount");
}

/// The live objects of each `(api_version, kind)`, in every namespace, that `keep` keeps.
pub async fn live_state(
    client: &kube::Client,
    kinds: &[(&str, &str)],
    keep: impl Fn(&kube::api::DynamicObject) -> bool,
) -> State {
    let mut out = State::new();
    for (api, kind) in kinds {
        let list = dynamic(client, api, kind, None)
            .await
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list {api} {kind}: {e}"));
        for o in list.items.iter().filter(|o| keep(o)) {
            out.insert(
                (
                    kind.to_string(),
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default(),
                ),
                (
                    o.metadata.uid.clone().unwrap_or_default(),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                ),
            );
        }
    }
    out
}
