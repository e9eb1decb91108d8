//! Slow response bodies: while the dribble fault is on, a response body is re-chunked into
//! pieces of at most N bytes with a pause between two pieces, so clients meet a slow server
//! (lists that take long to arrive, watch events split across reads). The setting is read
//! again before every piece, so turning it off speeds up open watches too. This module only
//! re-times bytes; it never changes them.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;

use crate::Inner;

struct Dribbling {
    data: axum::body::BodyDataStream,
    pending: Bytes,
    inner: Arc<Inner>,
    started: bool,
}

/// `response` with its body written slowly (see the module docs).
pub(crate) fn dribble(inner: Arc<Inner>, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let state = Dribbling {
        data: body.into_data_stream(),
        pending: Bytes::new(),
        inner,
        started: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        while st.pending.is_empty() {
            match st.data.next().await? {
                Ok(bytes) => st.pending = bytes,
                Err(e) => return Some((Err(e), st)),
            }
        }
        let (size, pause) = st
            .inner
            .faults
            .dribble_setting()
            .unwrap_or((st.pending.len(), std::time::Duration::ZERO));
        if st.started && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        st.started = true;
        let chunk = st.pending.split_to(size.min(st.pending.len()));
        Some((Ok(chunk), st))
    });
    Response::from_parts(parts, Body::from_stream(stream))
}
