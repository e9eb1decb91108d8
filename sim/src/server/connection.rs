//! The connection layer: the accept loop serving HTTP/1.1 on each TCP connection, where an
//! unreachable server is simulated as a network cut (every open connection dropped without a
//! goodbye, new ones accepted and closed without a response) and where shutdown stops
//! accepting and ends connections gracefully. While unreachable, a new connection whose
//! request line names `/_sim/` is still served, so the fault can be switched off over HTTP;
//! that peek at the request line is the only look inside a request this module takes.

use std::sync::Arc;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};

use crate::Inner;

/// Accepts connections on `listener` and serves `app` on each until the simulator shuts down.
pub(crate) async fn serve(listener: TcpListener, app: Router, inner: Arc<Inner>) {
    let shutdown = inner.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if inner.faults.is_unreachable() {
            inner.faults.count_effect("refusedConnections", 1);
            tokio::spawn(serve_admin_only(stream, app.clone(), inner.clone()));
            continue;
        }
        tokio::spawn(serve_connection(stream, app.clone(), inner.clone()));
    }
}

/// While unreachable: serves the connection only if its first request is for `/_sim/`, else
/// closes it without a response.
async fn serve_admin_only(stream: TcpStream, app: Router, inner: Arc<Inner>) {
    if requests_admin(&stream).await {
        serve_connection(stream, app, inner).await;
    }
}

/// Whether the request line (peeked, not consumed) targets `/_sim/`. Gives up (false) when
/// the client sends nothing for 500 ms.
async fn requests_admin(stream: &TcpStream) -> bool {
    const ADMIN: &[u8] = b"/_sim/";
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(500);
    let mut buf = [0u8; 16];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return false,
        };
        let head = &buf[..n];
        if let Some(space) = head.iter().position(|b| *b == b' ') {
            let target = &head[space + 1..];
            if target.len() >= ADMIN.len() {
                return target.starts_with(ADMIN);
            }
            if !ADMIN.starts_with(target) {
                return false;
            }
        } else if n == buf.len() {
            return false;
        }
        // Only part of the request line has arrived: peek again shortly.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

async fn serve_connection(stream: TcpStream, app: Router, inner: Arc<Inner>) {
    let cut = inner.faults.cut_token();
    let shutdown = inner.shutdown.clone();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay");
    }
    let service = TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            return;
        }
        // Dropping the connection closes the socket mid-response: the network cut.
        _ = cut.cancelled() => return,
        _ = shutdown.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = cut.cancelled() => {}
    }
}
