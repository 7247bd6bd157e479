//! The calls a service received, kept while recording is on ([`StubServer::record_calls`]):
//! what `fanout test` checks a case's backend calls against (path, query, headers, body). Off by
//! default; when off, a request costs one relaxed atomic load.
//!
//! [`StubServer::record_calls`]: crate::StubServer::record_calls

use bytes::Bytes;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One request a stub service received while recording was on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// The route that answered it, `"METHOD PATH-PATTERN"`.
    pub route: String,
    /// The request's method.
    pub method: String,
    /// The request's path (without the query).
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// The request headers (names lower-case, values lossily decoded), in the order received.
    pub headers: Vec<(String, String)>,
    /// The request body as received (a gRPC route: the request message as JSON).
    pub body: Bytes,
}

/// A service's recorded calls: at most `limit` kept (`0`: recording off).
#[derive(Default)]
pub(crate) struct Recorder {
    limit: AtomicUsize,
    calls: Mutex<Vec<RecordedCall>>,
}

impl Recorder {
    /// Keep at most `limit` calls from now on (`0` turns recording off); drops those kept.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
        self.clear();
    }

    /// Whether calls are recorded.
    pub(crate) fn on(&self) -> bool {
        self.limit.load(Ordering::Relaxed) > 0
    }

    /// Record `call` (dropped past the limit).
    pub(crate) fn push(&self, call: RecordedCall) {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if calls.len() < limit {
            calls.push(call);
        }
    }

    /// The calls kept, in the order they were received.
    pub(crate) fn calls(&self) -> Vec<RecordedCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Drop the calls kept.
    pub(crate) fn clear(&self) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
