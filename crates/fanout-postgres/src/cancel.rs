//! Connections through the row guard (each server of the URL in turn, as the driver tries them,
//! `target_session_attrs` checked) and the confirmed cancel: a CancelRequest to the same server,
//! waited for until the server closes that connection.

use super::*;

/// A server a plain connection is opened to: a TCP host or a Unix socket directory, with its
/// port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Peer {
    Tcp(String, u16),
    Unix(std::path::PathBuf, u16),
}

/// The servers of `pg` in the order the driver tries them (shuffled with
/// `load_balance_hosts=random`), each with its port; a `hostaddr` stands for its host. Empty when
/// the URL's lists do not match (the driver's own attempt then says why).
pub(super) fn peers(pg: &tokio_postgres::Config) -> Vec<Peer> {
    use tokio_postgres::config::{Host, LoadBalanceHosts};
    let (hosts, addrs, ports) = (pg.get_hosts(), pg.get_hostaddrs(), pg.get_ports());
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return Vec::new();
    }
    let n = hosts.len().max(addrs.len());
    if ports.len() > 1 && ports.len() != n {
        return Vec::new();
    }
    let mut out: Vec<Peer> = (0..n)
        .filter_map(|i| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => Some(Peer::Tcp(ip.to_string(), port)),
                (None, Some(Host::Tcp(h))) => Some(Peer::Tcp(h.clone(), port)),
                (None, Some(Host::Unix(dir))) => Some(Peer::Unix(dir.clone(), port)),
                (None, None) => None,
            }
        })
        .collect();
    if pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use rand::seq::SliceRandom;
        out.shuffle(&mut rand::rng());
    }
    out
}

/// The socket file of a server listening in `dir` on `port`, as libpq names it.
pub(super) fn unix_socket(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// A plain connection through the row guard (`guard.rs`): each server of the URL in turn, as
/// the driver tries them — our socket handed to it, and `target_session_attrs` checked as it
/// checks it. `None` when no socket could be opened to any (the caller lets the driver's own
/// attempt say why); else the connection and its server, or the last server's refusal.
pub(super) async fn connect_plain(
    pg: &tokio_postgres::Config,
    limit: usize,
    tripped: &guard::Tripped,
) -> Option<Result<(Client, Peer), tokio_postgres::Error>> {
    let mut refused = None;
    for peer in peers(pg) {
        let client = match &peer {
            Peer::Tcp(host, port) => {
                let Ok(tcp) = guard::tcp(host, *port).await else {
                    continue;
                };
                let stream = guard::Guarded::new(tcp, limit, tripped.clone());
                pg.connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map(|(c, conn)| {
                        tokio::spawn(conn);
                        c
                    })
            }
            Peer::Unix(dir, port) => {
                let Ok(unix) = tokio::net::UnixStream::connect(unix_socket(dir, *port)).await
                else {
                    continue;
                };
                let stream = guard::Guarded::new(unix, limit, tripped.clone());
                pg.connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map(|(c, conn)| {
                        tokio::spawn(conn);
                        c
                    })
            }
        };
        match client {
            Ok(c) => match session_fits(pg, &c).await {
                Ok(true) => return Some(Ok((c, peer))),
                Ok(false) => continue,
                Err(e) => refused = Some(e),
            },
            Err(e) => refused = Some(e),
        }
    }
    refused.map(Err)
}

/// Whether a new session is what the URL's `target_session_attrs` asks for (`read-write`: a
/// server that accepts writes), as the driver checks it.
pub(super) async fn session_fits(
    pg: &tokio_postgres::Config,
    c: &Client,
) -> Result<bool, tokio_postgres::Error> {
    use tokio_postgres::config::TargetSessionAttrs;
    let wanted = pg.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok(true);
    }
    let read_only = c
        .simple_query("SHOW transaction_read_only")
        .await?
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "on"),
            _ => None,
        });
    Ok(match wanted {
        TargetSessionAttrs::ReadWrite => read_only == Some(false),
        TargetSessionAttrs::ReadOnly => read_only == Some(true),
        _ => true,
    })
}

/// Send a CancelRequest to `peer` (plain TCP or a Unix socket) and wait until the server closes
/// that connection, which it does after signalling the statement's backend: `Ok(true)`.
pub(super) async fn cancel_confirmed(
    token: &tokio_postgres::CancelToken,
    peer: &Peer,
) -> Result<bool, String> {
    match peer {
        Peer::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?;
            cancel_over(token, stream).await
        }
        Peer::Unix(dir, port) => {
            let stream = tokio::net::UnixStream::connect(unix_socket(dir, *port))
                .await
                .map_err(|e| e.to_string())?;
            cancel_over(token, stream).await
        }
    }
}

/// [`cancel_confirmed`] over an open stream.
pub(super) async fn cancel_over<S>(
    token: &tokio_postgres::CancelToken,
    mut stream: S,
) -> Result<bool, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    token
        .cancel_query_raw(&mut stream, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(true),
            Ok(_) => {}
        }
    }
}
