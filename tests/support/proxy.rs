//! A TCP proxy on a free loopback port in front of a server the tests start: takes the server
//! off the network and back ([`Proxy::stop`], [`Proxy::resume`]), or cuts the open
//! connections mid-stream ([`Proxy::reset`]). Used by `kafka_server.rs` (in front of tansu)
//! and the real-server tests (in front of kube-apiserver).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::ports::free_listener;

/// A proxy to one target address.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: SocketAddr,
    task: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts a proxy to `target` on a free port, held from the moment it is chosen.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = free_listener();
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("proxy listener");
        let mut p = Proxy {
            addr: listener.local_addr().expect("proxy address"),
            target,
            task: None,
            conns: Arc::default(),
        };
        p.serve(listener);
        p
    }

    /// Listens again on the same address. The listener of [`Proxy::stop`] is closed when its
    /// aborted task is dropped, which the runtime does soon but not at once: retried for 10 s.
    pub async fn resume(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("proxy bind {} (retrying): {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("proxy bind {}: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let target = self.target;
        let conns = self.conns.clone();
        self.task = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let h = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(h);
            }
        }));
    }

    /// Cuts every open connection (each side sees a reset or EOF mid-stream) and goes on
    /// listening: clients reconnect at once.
    pub fn reset(&self) {
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            c.abort();
        }
    }

    /// Cuts every connection and stops listening (clients get "connection refused") until
    /// [`Proxy::resume`].
    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}
