//! A real `nats-server` for tests and benches: started on a free port (never 4222) with
//! JetStream and a store in its own temp dir, killed on drop. Optional extra configuration
//! (auth, TLS, `max_payload`) is written to a config file. Also generates TLS certificates
//! with the `openssl` CLI.

use crate::ports::free_port;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `nats-server` (see the module's comment); killed on drop.
pub struct NatsServer {
    child: Option<Child>,
    /// Its client port on 127.0.0.1, the same across restarts.
    pub port: u16,
    /// The HTTP monitoring port (`/connz`), the same across restarts.
    pub monitor_port: u16,
    /// Its directory: config file, JetStream store, log.
    pub dir: tempfile::TempDir,
    conf: PathBuf,
}

impl NatsServer {
    /// Starts a server with JetStream; `extra_conf` is nats-server configuration text
    /// (may be empty).
    pub fn start(extra_conf: &str) -> NatsServer {
        let dir = tempfile::tempdir().expect("tempdir");
        NatsServer::start_in(dir, extra_conf)
    }

    /// Starts in an existing dir (where certificates were generated).
    pub fn start_in(dir: tempfile::TempDir, extra_conf: &str) -> NatsServer {
        let port = free_port();
        let conf = dir.path().join("nats.conf");
        std::fs::write(&conf, extra_conf).expect("write nats.conf");
        let mut s = NatsServer {
            child: None,
            port,
            monitor_port: free_port(),
            dir,
            conf,
        };
        // A port this process chose can still be taken by another process (a second test
        // suite on the machine): nats-server then exits at once, and another server answers
        // the port. Choose again.
        for _ in 0..3 {
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => {
                    eprintln!("nats-server on port {}: {e}; choosing other ports", s.port);
                    (s.port, s.monitor_port) = (free_port(), free_port());
                }
            }
        }
        if let Err(e) = s.spawn() {
            panic!("nats-server did not start: {e}");
        }
        s
    }

    /// Starts nats-server and waits until it answers its port with NATS's `INFO` greeting.
    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("log file");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&self.conf)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-m",
                &self.monitor_port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path().join("store"))
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("nats-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!("exited ({status}): {}", self.log()));
            }
            if let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                use std::io::Read;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut greeting = [0u8; 5];
                if conn.read_exact(&mut greeting).is_ok() && &greeting == b"INFO " {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!(
                    "did not greet on {addr} within 20 s: {}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (the store stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the server keeps its connections open and answers nothing (a hung server).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`NatsServer::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            panic!("nats-server did not start again: {e}");
        }
    }

    /// The client connections the server has now (`/connz`): (name, connection id).
    pub fn connections(&self) -> Vec<(String, u64)> {
        use std::io::{Read, Write};
        let mut conn = TcpStream::connect(("127.0.0.1", self.monitor_port)).expect("monitor port");
        conn.write_all(b"GET /connz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .expect("request");
        let mut text = String::new();
        conn.read_to_string(&mut text).expect("response");
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: serde_json::Value = serde_json::from_str(body).expect("connz is JSON");
        v["connections"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or_default().to_owned(),
                            c["cid"].as_u64().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CA, server (SAN 127.0.0.1, localhost) and client certificates in `dir`:
/// `ca.pem`, `server.pem`, `server-key.pem`, `client.pem`, `client-key.pem`.
pub fn generate_certs(dir: &Path) {
    let run = |args: &[&str]| crate::kube_server::openssl(dir, args);
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=kubesink test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        ),
        (
            "client",
            "subjectAltName=DNS:kubesink\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        ),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
        run(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &format!("{name}-key.pem"),
            "-out", &format!("{name}.csr"), "-subj", &format!("/CN={name}"),
        ]);
        run(&[
            "x509", "-req", "-in", &format!("{name}.csr"), "-CA", "ca.pem", "-CAkey",
            "ca-key.pem", "-CAcreateserial", "-days", "2", "-out", &format!("{name}.pem"),
            "-extfile", &format!("{name}.ext"),
        ]);
    }
}

/// Every message of JetStream stream `stream`, in stream order.
pub async fn jetstream_messages(url: &str, stream: &str) -> Result<Vec<serde_json::Value>, String> {
    use futures::StreamExt;
    let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(stream).await.map_err(|e| e.to_string())?;
    let total = s.info().await.map_err(|e| e.to_string())?.state.messages as usize;
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return Ok(out);
    }
    let consumer = s
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut msgs = consumer.messages().await.map_err(|e| e.to_string())?;
    while out.len() < total {
        let m = tokio::time::timeout(Duration::from_secs(10), msgs.next())
            .await
            .map_err(|_| "the stream stopped delivering".to_owned())?
            .ok_or("the stream ended")?
            .map_err(|e| e.to_string())?;
        out.push(serde_json::from_slice(&m.payload).map_err(|e| e.to_string())?);
    }
    Ok(out)
}
