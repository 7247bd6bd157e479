//! Calibration: run a schedule against an in-process zero-latency (or fixed-latency) stub and
//! print the summary and per-second figures — how fast this host can generate load validly.
//!
//! `cargo run --release -p fanout-load --example calibrate -- 'const(5000,5s)' [latency|URL] [http1|http2] [max_connections]`
//!
//! With a URL (`http://127.0.0.1:9101/x`) instead of a latency, the load goes to that target
//! (e.g. a `fanout stub` in another process) and no in-process stub is started.

use fanout_load::{LoadSpec, Protocol, RequestTemplate, Schedule, run, summary_text};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let schedule = Schedule::parse(args.first().map_or("const(1000,5s)", |s| s.as_str()))?;
    let second = args.get(1).map_or("0ms", |s| s.as_str());
    let protocol: Protocol = args.get(2).map_or("http1", |s| s.as_str()).parse()?;
    let (_stub, target, path) = if let Some(rest) = second.strip_prefix("http://") {
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        (None, format!("http://{authority}"), format!("/{path}"))
    } else {
        let yaml = format!(
            "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - {{path: /x, latency: {second}, body: '{{ok: true}}'}}\n"
        );
        let stub = fanout_stub::load("s.yaml", &yaml, &|_| None)?
            .start()
            .await?;
        let addr = stub.addr("a").ok_or("no stub")?;
        (Some(stub), format!("http://{addr}"), "/x".to_string())
    };
    let mut spec = LoadSpec::new(target, schedule);
    spec.requests = vec![RequestTemplate::get(path)];
    spec.protocol = protocol;
    if let Some(c) = args.get(3) {
        spec.max_connections = c.parse()?;
    }
    spec.drain = std::time::Duration::from_secs(2);
    let report = run(
        &spec,
        Some(&|s: &fanout_load::SecondStats| {
            eprintln!(
                "t={:>3} offered {:>6} sent {:>6} ok {:>6} err {:>4} p50 {:>7.2} p99 {:>7.2} max {:>7.2} lag_p99 {:>6.2}",
                s.t, s.offered, s.sent, s.ok, s.errors, s.p50_ms, s.p99_ms, s.max_ms, s.lag_p99_ms
            )
        }),
    )
    .await?;
    print!("{}", summary_text(&report));
    Ok(())
}
