//! The HTTP server (axum) on `server.listen`: `GET /metrics` (Prometheus text format),
//! `GET /healthz` (liveness) and `GET /readyz` (readiness), each health answer `200` or
//! `503` with a JSON body naming what is wrong. It serves read-only views; it never changes
//! the data path.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{Observed, Report};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[error("server.listen {addr}: cannot listen: {source}")]
pub struct ServeError {
    /// The configured address.
    pub addr: SocketAddr,
    /// The bind error.
    pub source: std::io::Error,
}

/// Why `[server]` could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// `server.listen` is not an address.
    #[error("server.listen {0:?} is not an address:port")]
    Address(String),
    /// The address cannot be listened on.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Serves `observed` on `server.listen` until `cancel` when `server.enabled`; returns the
/// bound address (`None` when off; port 0 picks one).
///
/// # Errors
/// [`ListenError`] when `server.listen` is not an address or cannot be bound.
pub async fn serve_configured(
    server: &crate::config::ServerConfig,
    observed: Arc<dyn Observed>,
    cancel: CancellationToken,
) -> Result<Option<SocketAddr>, ListenError> {
    if !server.enabled {
        return Ok(None);
    }
    let addr: SocketAddr = server
        .listen
        .parse()
        .map_err(|_| ListenError::Address(server.listen.clone()))?;
    Ok(Some(serve(addr, observed, cancel).await?))
}

/// Binds `addr` and serves until `cancel`; returns the bound address (port 0 picks one).
///
/// # Errors
/// [`ServeError`] when the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    observed: Arc<dyn Observed>,
    cancel: CancellationToken,
) -> Result<SocketAddr, ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError { addr, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(observed);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    Ok(bound)
}

async fn metrics(State(o): State<Arc<dyn Observed>>) -> Response {
    let (text, content_type) = o.metrics();
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

fn health(r: Report) -> Response {
    let code = if r.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        r.body.to_string(),
    )
        .into_response()
}

async fn healthz(State(o): State<Arc<dyn Observed>>) -> Response {
    health(o.liveness())
}

async fn readyz(State(o): State<Arc<dyn Observed>>) -> Response {
    health(o.readiness())
}
