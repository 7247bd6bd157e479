//! What judging answers by `grpc-status` costs the generator: the same gRPC call and the same
//! answer (a framed message, then `grpc-status: 0` in the trailers) sent as `Protocol::Http2`
//! (judged by HTTP status) and as `Protocol::Grpc`, in alternating rounds, and the generator's
//! own CPU time per request — its threads only (the main thread, its tokio workers and the
//! pacer, from `/proc/self/task/*/schedstat`); the in-process h2c server runs on threads of its
//! own, which are not counted. Linux only.
//!
//! `cargo run --release -p fanout-load --example grpc_cpu -- [RATE] [SECONDS] [ROUNDS]`
//! (default `5000 5 3`).

use bytes::Bytes;
use fanout_load::{LoadSpec, Protocol, Schedule, grpc_request, load_protos, run};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;

const PROTO: &str = r#"syntax = "proto3";
package bench.v1;
service Echo { rpc Hello(HelloRequest) returns (HelloReply); }
message HelloRequest { string name = 1; int32 count = 2; }
message HelloReply { string message = 1; }
"#;

/// The generator's threads: the main thread, tokio workers named `gen`, the pacer.
fn generator_cpu_ns() -> u64 {
    let pid = std::process::id().to_string();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        let tid = t.file_name().to_string_lossy().into_owned();
        if tid != pid && !comm.starts_with("gen") && !comm.starts_with("fanout-load") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn answer() -> Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    // HelloReply { message: "hi" }, framed.
    let msg = Bytes::from_static(&[0, 0, 0, 0, 4, 0x0a, 2, b'h', b'i']);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(
        Full::new(msg)
            .with_trailers(std::future::ready(Some(Ok(trailers))))
            .boxed(),
    );
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

/// An h2c server on its own runtime (threads named `srv`): answers every call the same way.
fn server() -> Result<std::net::SocketAddr, Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("srv")
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("srv-main".into())
        .spawn(move || {
            rt.block_on(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let svc = service_fn(|req: Request<Incoming>| async move {
                            let _ = req.into_body().collect().await;
                            Ok::<_, Infallible>(answer())
                        });
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        })?;
    Ok(addr)
}

/// The work the gRPC verdict adds per answer, alone: look `grpc-status` up in the answer's
/// headers (absent) and in its trailers, and parse it.
fn micro() {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert(
        "date",
        HeaderValue::from_static("Mon, 01 Jan 2024 00:00:00 GMT"),
    );
    headers.insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers.insert("grpc-message", HeaderValue::from_static(""));
    let name = http::HeaderName::from_static("grpc-status");
    let n = 10_000_000u32;
    let start = std::time::Instant::now();
    let mut ok = 0u32;
    for _ in 0..n {
        let h = std::hint::black_box(&headers);
        let t = std::hint::black_box(&trailers);
        let code = h
            .get(&name)
            .or_else(|| t.get(&name))
            .map(|v| fanout_load::grpc::Code::from_header(v.as_bytes()));
        if code == Some(fanout_load::grpc::Code::Ok) {
            ok += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(n);
    println!("verdict alone: {ns:.1} ns per answer ({ok} OK)");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate: u64 = args.first().map_or(Ok(5000), |s| s.parse())?;
    let secs: u64 = args.get(1).map_or(Ok(5), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;

    let dir = std::env::temp_dir().join(format!("fanout-grpc-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("bench.proto"), PROTO)?;
    let protos = load_protos(&[dir.join("bench.proto")], &[])?;
    let call = grpc_request(
        &protos,
        "bench.v1.Echo/Hello",
        r#"{"name": "load", "count": 3}"#,
        &[],
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    let addr = server()?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gen")
        .enable_all()
        .build()?;
    let schedule = Schedule::parse(&format!("const({rate},{secs}s)"))?;
    let mut results: Vec<(Protocol, f64, f64, bool)> = Vec::new();
    for round in 0..rounds {
        // Alternate which goes first, so drift on a shared machine hits both alike.
        let order = if round % 2 == 0 {
            [Protocol::Http2, Protocol::Grpc]
        } else {
            [Protocol::Grpc, Protocol::Http2]
        };
        for protocol in order {
            let mut spec = LoadSpec::new(format!("http://{addr}"), schedule.clone());
            spec.protocol = protocol;
            spec.requests = vec![call.clone()];
            spec.drain = std::time::Duration::from_secs(2);
            let before = generator_cpu_ns();
            let report = rt.block_on(run(&spec, None))?;
            let used = generator_cpu_ns().saturating_sub(before);
            let per_req_us = used as f64 / 1000.0 / report.completed.max(1) as f64;
            eprintln!(
                "round {round} {:>5}: {} completed, {} ok, {:.2} µs CPU/request, p99 {:.2} ms, valid {}",
                protocol.to_string(),
                report.completed,
                report.ok,
                per_req_us,
                report.latency_ms.p99,
                report.valid
            );
            results.push((protocol, per_req_us, report.latency_ms.p99, report.valid));
        }
    }
    micro();
    for protocol in [Protocol::Http2, Protocol::Grpc] {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|r| r.0 == protocol)
            .map(|r| r.1)
            .collect();
        v.sort_by(f64::total_cmp);
        let median = v.get(v.len() / 2).copied().unwrap_or(0.0);
        println!(
            "{:>5}: median {median:.2} µs generator CPU per request ({v:.2?})",
            protocol.to_string()
        );
    }
    Ok(())
}
