//! Per-connection plumbing for the `reset` fault: the accepted socket is wrapped in
//! [`ResetOnDrop`], which sets `SO_LINGER` to 0 before the socket closes when the connection's
//! [`ConnCtx`] asks for a reset — the kernel then sends a TCP RST instead of a FIN.
//!
//! A request handler that draws `reset` calls [`ConnCtx::reset`]: it raises the flag and wakes
//! the connection task, which drops the whole hyper connection (all HTTP/2 streams included);
//! dropping the connection drops the socket wrapper, which applies the linger.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Shared by a connection's task, its socket wrapper and its request handlers.
#[derive(Debug, Default)]
pub(crate) struct ConnCtx {
    reset: AtomicBool,
    /// Woken when a handler wants the connection torn down.
    pub(crate) kill: Notify,
}

impl ConnCtx {
    /// Tear the connection down with a TCP RST (asynchronously: the connection task drops it).
    pub(crate) fn reset(&self) {
        self.reset.store(true, Ordering::Release);
        // `notify_one` stores a permit if the connection task is not waiting yet.
        self.kill.notify_one();
    }

    fn wants_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }
}

/// The accepted socket; on drop, lingers 0 (RST) if its [`ConnCtx`] asked for a reset.
pub(crate) struct ResetOnDrop {
    stream: TcpStream,
    ctx: std::sync::Arc<ConnCtx>,
}

impl ResetOnDrop {
    pub(crate) fn new(stream: TcpStream, ctx: std::sync::Arc<ConnCtx>) -> Self {
        ResetOnDrop { stream, ctx }
    }
}

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if self.ctx.wants_reset()
            && let Err(e) = self.stream.set_zero_linger()
        {
            tracing::debug!(error = %e, "cannot set SO_LINGER 0 for a reset fault");
        }
    }
}

impl AsyncRead for ResetOnDrop {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResetOnDrop {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
