//! A guard on the bytes a Postgres server sends: a DataRow message announcing more bytes than
//! the backend's `max_response_bytes` is refused from its 5-byte header, before the driver has
//! buffered it. tokio-postgres reads a message whole into its buffer before handing it on (its
//! codec has no size limit), so without this a 200 MB value is held — twice, while the buffer
//! grows — before the row can be looked at and refused.
//!
//! The guard sits between the socket (or the TLS stream) and the driver: it follows the message
//! boundaries of what it reads (tag, length, body) and fails the read at an oversized DataRow,
//! which ends the connection; [`Guarded::tripped`] tells the pool why, so the call is answered
//! as an answer past the cap (and its statement cancelled at the server), not as a lost database.
//! Message bodies are skipped, never copied: the cost is a few branches per read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Where the reader is in the server's message stream.
#[derive(Default)]
struct Scan {
    header: [u8; 5],
    /// Header bytes read so far (0–4).
    have: usize,
    /// Body bytes of the current message still to come.
    skip: usize,
}

impl Scan {
    /// Follow `data`; `Some(len)` when a DataRow (`D`) announces `len` > `limit` bytes.
    fn feed(&mut self, mut data: &[u8], limit: usize) -> Option<usize> {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let [tag, a, b, c, d] = self.header;
                // The length counts itself (4 bytes), not the tag.
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if tag == b'D' && len > limit {
                    return Some(len);
                }
                self.skip = len.saturating_sub(4);
            }
        }
        None
    }
}

/// The flag a connection's guard sets when it refused a row: the row's length in bytes (0: not
/// tripped).
pub(super) type Tripped = Arc<AtomicUsize>;

/// A stream from a Postgres server, refusing DataRow messages longer than `limit`.
pub(super) struct Guarded<S> {
    inner: S,
    limit: usize,
    scan: Scan,
    tripped: Tripped,
}

impl<S> Guarded<S> {
    pub(super) fn new(inner: S, limit: usize, tripped: Tripped) -> Self {
        Guarded {
            inner,
            limit,
            scan: Scan::default(),
            tripped,
        }
    }
}

fn refused(len: usize, limit: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("a row of {len} bytes is larger than max_response_bytes ({limit})"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let was = this.tripped.load(Ordering::Relaxed);
        if was > 0 {
            return Poll::Ready(Err(refused(was, this.limit)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(len) = this.scan.feed(&buf.filled()[before..], this.limit) {
            this.tripped.store(len, Ordering::Relaxed);
            return Poll::Ready(Err(refused(len, this.limit)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: TlsStream + Unpin> TlsStream for Guarded<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.inner.channel_binding()
    }
}

/// A TLS connector whose streams are [`Guarded`] (the guard reads the decrypted bytes).
#[derive(Clone)]
pub(super) struct GuardTls<M> {
    inner: M,
    limit: usize,
    tripped: Tripped,
}

impl<M> GuardTls<M> {
    pub(super) fn new(inner: M, limit: usize, tripped: Tripped) -> Self {
        GuardTls {
            inner,
            limit,
            tripped,
        }
    }
}

impl<S, M> MakeTlsConnect<S> for GuardTls<M>
where
    M: MakeTlsConnect<S>,
    <M::TlsConnect as TlsConnect<S>>::Future: Send + 'static,
    M::Stream: 'static,
{
    type Stream = Guarded<M::Stream>;
    type TlsConnect = GuardTls<M::TlsConnect>;
    type Error = M::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(GuardTls {
            inner: self.inner.make_tls_connect(domain)?,
            limit: self.limit,
            tripped: self.tripped.clone(),
        })
    }
}

impl<S, T> TlsConnect<S> for GuardTls<T>
where
    T: TlsConnect<S>,
    T::Future: Send + 'static,
    T::Stream: 'static,
{
    type Stream = Guarded<T::Stream>;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Stream, Self::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let (limit, tripped) = (self.limit, self.tripped);
        let handshake = self.inner.connect(stream);
        Box::pin(async move {
            let s = handshake.await?;
            Ok(Guarded::new(s, limit, tripped))
        })
    }
}

/// A TCP connection to `host:port` as tokio-postgres makes one (each address in turn, no delay,
/// keepalives on), for [`tokio_postgres::Config::connect_raw`] through a [`Guarded`] stream.
pub(super) async fn tcp(host: &str, port: u16) -> io::Result<tokio::net::TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_keepalive(true)?;
        match socket.connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: usize) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body + 4) as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(0u8, body));
        m
    }

    #[test]
    fn follows_messages_across_reads_and_stops_at_a_long_data_row() {
        let mut stream = Vec::new();
        stream.extend(msg(b'T', 30));
        stream.extend(msg(b'D', 96)); // exactly the limit, with its length field
        stream.extend(msg(b'X', 5000)); // not a row: any length
        stream.extend(msg(b'D', 97));
        // Fed a byte at a time and in one piece: the same verdict, at the same message.
        let mut scan = Scan::default();
        let mut at = None;
        for (i, b) in stream.iter().enumerate() {
            if let Some(len) = scan.feed(std::slice::from_ref(b), 100) {
                at = Some((i, len));
                break;
            }
        }
        assert_eq!(at, Some((stream.len() - 97 - 1, 101)));
        assert_eq!(Scan::default().feed(&stream, 100), Some(101));
        assert_eq!(
            Scan::default().feed(&stream[..stream.len() - 102], 100),
            None
        );
    }
}
