//! Parsed and validated documents by their text, bounded (`limits.cached_documents`): the
//! least recently used is dropped first.

use apollo_compiler::ExecutableDocument;
use apollo_compiler::validation::Valid;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The cache of one GraphQL route.
pub(crate) struct DocCache {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    docs: HashMap<Arc<str>, (Arc<Valid<ExecutableDocument>>, u64)>,
    clock: u64,
}

impl DocCache {
    pub(crate) fn new(max: usize) -> DocCache {
        DocCache {
            max,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub(crate) fn get(&self, text: &str) -> Option<Arc<Valid<ExecutableDocument>>> {
        let mut g = self.inner.lock().ok()?;
        g.clock += 1;
        let now = g.clock;
        let (doc, used) = g.docs.get_mut(text)?;
        *used = now;
        Some(doc.clone())
    }

    pub(crate) fn put(&self, text: &str, doc: Arc<Valid<ExecutableDocument>>) {
        if self.max == 0 {
            return;
        }
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if g.docs.len() >= self.max {
            // Drop the least recently used (a scan: only when full, of at most `max` entries).
            if let Some(oldest) = g
                .docs
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                g.docs.remove(&oldest);
            }
        }
        g.clock += 1;
        let now = g.clock;
        g.docs.insert(text.into(), (doc, now));
    }
}
