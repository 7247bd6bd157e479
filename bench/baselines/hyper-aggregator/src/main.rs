//! `hyper-aggregator` binary: arguments, runtime and signals only; the server is the library.
//!
//! ```text
//! hyper-aggregator [--listen ADDR] [--workers N]
//! ```
//!
//! `--listen` defaults to `$LISTEN`, then `127.0.0.1:8090`; `--workers` to one thread per core.
//! Backend addresses come from `SEARCH_ADDR`, `VACANCIES_ADDR`, `MASKS_ADDR`,
//! `RECOMMENDATIONS_ADDR`, `PRICE_ADDR`, `STOCK_ADDR`, `MEDIA_ADDR`, `POSTS_ADDR`, `USERS_ADDR` and `ITEM_ADDR`.

use hyper_aggregator::{Config, DEFAULT_LISTEN, serve, shutdown_signal};
use std::process::ExitCode;
use tokio::net::TcpListener;

// Same allocator as the fanout binary, so the comparison is about the code, not malloc.
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

const USAGE: &str = "usage: hyper-aggregator [--listen ADDR] [--workers N]

Serves GET /vacancies and POST /product-page (the hh-vacancies and product-page examples)
and GET /posts (the lab's n-plus-one scenario)
hand-written on hyper, as the load lab's baseline.

  --listen ADDR   listen address (default: $LISTEN, else 127.0.0.1:8090)
  --workers N     runtime worker threads (default: one per core)

Backends (host:port): SEARCH_ADDR VACANCIES_ADDR MASKS_ADDR RECOMMENDATIONS_ADDR
PRICE_ADDR STOCK_ADDR MEDIA_ADDR POSTS_ADDR USERS_ADDR ITEM_ADDR, defaults as in the examples
and the lab's n-plus-one stubs.";

#[derive(Debug, Default, PartialEq)]
struct Args {
    listen: Option<String>,
    workers: Option<usize>,
    help: bool,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--listen" => out.listen = Some(value()?),
            "--workers" => {
                let v = value()?;
                let n =
                    v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("--workers: expected a positive number, got `{v}`")
                    })?;
                out.workers = Some(n);
            }
            "-h" | "--help" => out.help = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let listen = args
        .listen
        .or_else(|| std::env::var("LISTEN").ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        runtime.worker_threads(n);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config::from_env();
    let result = runtime.block_on(async {
        let listener = TcpListener::bind(&listen)
            .await
            .map_err(|e| format!("binding {listen}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("hyper-aggregator listening on {addr} ({config:?})");
        serve(config, listener, shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_both_forms() {
        assert_eq!(parse(&[]), Ok(Args::default()));
        let want = Args {
            listen: Some("0.0.0.0:9000".into()),
            workers: Some(4),
            help: false,
        };
        assert_eq!(
            parse(&["--listen", "0.0.0.0:9000", "--workers", "4"]),
            Ok(want)
        );
        let want = Args {
            listen: Some("0.0.0.0:9000".into()),
            workers: Some(4),
            help: false,
        };
        assert_eq!(parse(&["--listen=0.0.0.0:9000", "--workers=4"]), Ok(want));
        assert!(parse(&["--help"]).is_ok_and(|a| a.help));
    }

    #[test]
    fn rejects_bad_arguments() {
        assert!(parse(&["--listen"]).is_err());
        assert!(parse(&["--workers", "0"]).is_err());
        assert!(parse(&["--workers", "many"]).is_err());
        assert!(parse(&["--port", "1"]).is_err());
    }
}
