//! The report end to end: trials → summary → text, JSON and HTML.

use super::*;
use crate::svg::esc;
use crate::{LAG_THRESHOLD, LabOptions};

/// A recorded trial of `target` (LoadReport with the figures the summary reads).
fn trial(target: &str, phase: &str, rate: f64, p99_ms: f64, lag_p99_ms: f64) -> Trial {
    let limit_ms = LAG_THRESHOLD.as_secs_f64() * 1000.0;
    let valid = lag_p99_ms <= limit_ms;
    let invalid_reason = (!valid).then(|| {
        format!("generator lagged behind schedule: lag p99 {lag_p99_ms:.2} ms > {limit_ms:.2} ms")
    });
    let stats = fanout_load::LatencyStats {
        p50: p99_ms / 2.0,
        p99: p99_ms,
        ..Default::default()
    };
    let load = fanout_load::LoadReport {
        target: "http://127.0.0.1:9".into(),
        protocol: fanout_load::Protocol::Http1,
        schedule: format!("const({rate},1000ms)"),
        duration_s: 1.0,
        elapsed_s: 1.0,
        offered: rate as u64,
        sent: rate as u64,
        completed: rate as u64,
        ok: rate as u64,
        rejected: 0,
        partial: 0,
        offered_rps: rate,
        achieved_rps: rate,
        status_classes: Default::default(),
        errors: Default::default(),
        grpc_status: None,
        grpc_missing_status: None,
        error_rate: 0.0,
        latency_ms: stats,
        ok_latency_ms: stats,
        rejected_latency_ms: Default::default(),
        service_ms: stats,
        lag_ms: Default::default(),
        late_fraction: 0.0,
        valid,
        invalid_reason: invalid_reason.clone(),
        connections_opened: 1,
        max_connections_used: 1,
        bytes_received: 0,
        events: None,
        seconds: vec![],
        by_send_second: vec![],
        second_histograms: vec![],
        latency_hist: fanout_load::empty_histogram(),
        service_hist: fanout_load::empty_histogram(),
        lag_hist: fanout_load::empty_histogram(),
    };
    Trial {
        target: target.into(),
        phase: phase.into(),
        round: 0,
        t_start: 0.0,
        t_end: 1.0,
        schedule: load.schedule.clone(),
        offered_rate: rate,
        achieved_rate: rate,
        p50_ms: stats.p50,
        p99_ms,
        error_rate: 0.0,
        cpu_us_per_request: 100.0,
        generator_cpu_us_per_request: 10.0,
        backend_calls_per_request: 8.0,
        stub_overshoot_p99_us: None,
        ctx_switches_per_request: 1.0,
        threads: 4,
        rss_mb: 10.0,
        valid,
        invalid_reason,
        passed_slo: valid && p99_ms <= 50.0,
        lag_p99_ms,
        route: None,
        stage: None,
        phase_bounds: vec![],
        samples: vec![],
        load,
    }
}

fn report(targets: &[&str], caps: &[(&str, f64)], trials: Vec<Trial>) -> LabReport {
    let Some(scenario) = crate::scenario::builtin("product-page") else {
        panic!("the product-page scenario exists");
    };
    let opts = LabOptions {
        duration: None,
        capacity: None,
        scenario: "product-page".into(),
        targets: targets.iter().map(|t| t.to_string()).collect(),
        quick: true,
        out: std::env::temp_dir(),
        trials: None,
        fanout_bin: "fanout".into(),
        baseline_bin: None,
        command: "fanout lab product-page --quick".into(),
    };
    let caps = caps.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    build(
        &opts,
        &scenario,
        None,
        caps,
        trials,
        BTreeMap::new(),
        vec![],
    )
}

#[test]
fn an_all_flagged_row_says_why_it_has_no_max_rate() {
    // fanout: every trial (search steps and levels) flagged; hyper-baseline: a real capacity.
    let mut trials = vec![
        trial("fanout", "search", 250.0, 12.0, 3.2),
        trial("fanout", "search", 250.0, 12.0, 4.1),
        trial("fanout", "search", 125.0, 11.0, 2.6),
    ];
    for round in 0..3 {
        let mut t = trial("fanout", "level-50", 50.0, 10.0, 3.0);
        t.round = round;
        trials.push(t);
        trials.push(trial("hyper-baseline", "level-50", 50.0, 9.0, 0.2));
    }
    trials.push(trial("hyper-baseline", "search", 250.0, 9.0, 0.3));
    let rep = report(
        &["fanout", "hyper-baseline"],
        &[("fanout", 0.0), ("hyper-baseline", 250.0)],
        trials,
    );
    let why = rep.targets["fanout"]
        .max_rate_reason
        .clone()
        .unwrap_or_default();
    assert_eq!(
        why,
        "no valid trial: all 6 flagged — generator behind schedule (lag p99 2.6–4.1 ms > 2 ms)"
    );
    assert_eq!(rep.targets["hyper-baseline"].max_rate_reason, None);

    let text = text_summary(&rep);
    assert!(text.contains(&format!("  max_rate: {why}")), "{text}");
    let fanout_line = text
        .lines()
        .find(|l| l.starts_with("fanout "))
        .unwrap_or_default();
    assert!(
        fanout_line.contains("max_rate        - req/s"),
        "no bare 0: {fanout_line}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("hyper-baseline") && l.contains("max_rate      250 req/s")),
        "{text}"
    );

    let json = serde_json::to_value(&rep).unwrap_or_default();
    assert_eq!(json["targets"]["fanout"]["max_rate_reason"], why.as_str());
    assert_eq!(json["targets"]["fanout"]["max_rate"], 0.0);
    assert!(json["targets"]["hyper-baseline"]["max_rate_reason"].is_null());

    let page = html(&rep, "{}");
    assert!(page.contains(&esc(&why)), "the summary row says why");
    assert!(
        !page.contains("<td>fanout</td><td>0.00</td>"),
        "no bare 0.00 in the summary row"
    );
}

#[test]
fn a_zero_max_rate_names_its_cause() {
    // Only the search steps flagged (the levels at a low rate were fine).
    let mut trials = vec![
        trial("fanout", "search", 250.0, 12.0, 4.1),
        trial("fanout", "search", 250.0, 12.0, 4.1),
    ];
    trials.push(trial("fanout", "level-50", 50.0, 10.0, 0.1));
    let rep = report(&["fanout"], &[("fanout", 0.0)], trials);
    assert_eq!(
        rep.targets["fanout"].max_rate_reason.as_deref(),
        Some(
            "no valid capacity-search step: all 2 flagged — generator behind schedule (lag p99 4.1 ms > 2 ms)"
        )
    );
    // A valid step that missed the SLO: a finding, with its figures.
    let trials = vec![
        trial("fanout", "search", 250.0, 80.0, 0.1),
        trial("fanout", "search", 125.0, 60.0, 3.5),
    ];
    let rep = report(&["fanout"], &[("fanout", 0.0)], trials);
    let why = rep.targets["fanout"]
        .max_rate_reason
        .clone()
        .unwrap_or_default();
    assert!(
        why.starts_with("no capacity-search step met the SLO"),
        "{why}"
    );
    assert!(why.contains("at 250 req/s: p99 80.0 ms > 50 ms"), "{why}");
    assert!(why.contains("1 of 2 steps flagged"), "{why}");
    // A measured capacity needs no reason.
    let rep = report(
        &["fanout"],
        &[("fanout", 250.0)],
        vec![trial("fanout", "search", 250.0, 10.0, 0.1)],
    );
    assert_eq!(rep.targets["fanout"].max_rate_reason, None);
}

/// Targets whose backend calls per request differ at a level did different work: the report
/// says so (issue 25 §3); equal calls give no warning.
#[test]
fn unequal_backend_calls_per_request_are_warned_about() {
    let run = |fanout_calls: f64| {
        let mut trials = Vec::new();
        for round in 0..3 {
            let mut f = trial("fanout", "level-50", 50.0, 5.0, 0.2);
            f.round = round;
            f.backend_calls_per_request = fanout_calls;
            trials.push(f);
            trials.push(trial("hyper-baseline", "level-50", 50.0, 5.0, 0.2));
        }
        report(
            &["fanout", "hyper-baseline"],
            &[("fanout", 100.0), ("hyper-baseline", 100.0)],
            trials,
        )
    };
    let shared = run(0.5);
    let w: Vec<&String> = shared
        .warnings
        .iter()
        .filter(|w| w.starts_with("unequal work"))
        .collect();
    assert_eq!(w.len(), 1, "{:?}", shared.warnings);
    assert!(w[0].contains("level-50"), "{}", w[0]);
    assert!(
        w[0].contains("fanout 0.50, hyper-baseline 8.00"),
        "{}",
        w[0]
    );
    let equal = run(8.0);
    assert!(
        !equal.warnings.iter().any(|w| w.starts_with("unequal work")),
        "{:?}",
        equal.warnings
    );
}

#[test]
fn each_target_is_read_against_the_baseline_round_by_round_and_by_medians() {
    // Round 1 met a busy machine (both sides cost twice as much), round 2 a quiet baseline
    // trial: the target is at 0.9× the baseline in two rounds of three, 1.1× in the third, and
    // the medians over the run (165 vs 150) read 1.1×.
    let rounds = [(90.0, 100.0), (180.0, 200.0), (165.0, 150.0)];
    let mut trials = Vec::new();
    for (round, (fanout_cpu, base_cpu)) in rounds.into_iter().enumerate() {
        let mut f = trial("fanout", "level-50", 50.0, 5.0, 0.2);
        f.round = round;
        f.cpu_us_per_request = fanout_cpu;
        let mut b = trial("hyper-baseline", "level-50", 50.0, 5.0, 0.2);
        b.round = round;
        b.cpu_us_per_request = base_cpu;
        trials.push(f);
        trials.push(b);
    }
    let rep = report(
        &["fanout", "hyper-baseline"],
        &[("fanout", 100.0), ("hyper-baseline", 100.0)],
        trials,
    );
    assert_eq!(rep.relative.len(), 1, "{:?}", rep.relative);
    let r = &rep.relative[0];
    assert_eq!(
        (r.target.as_str(), r.baseline.as_str(), r.level.as_str()),
        ("fanout", "hyper-baseline", "level-50")
    );
    assert_eq!(r.per_round.n, 3);
    assert!(
        (r.per_round.median - 0.9).abs() < 0.001,
        "{:?}",
        r.per_round
    );
    assert!((r.per_round.min - 0.9).abs() < 0.001, "{:?}", r.per_round);
    assert!((r.per_round.max - 1.1).abs() < 0.001, "{:?}", r.per_round);
    let of_medians = r.ratio_of_medians.unwrap_or(f64::NAN);
    assert!((of_medians - 1.1).abs() < 0.001, "{of_medians}");
    let text = text::text_summary(&rep);
    assert!(
        text.contains("CPU per request beside hyper-baseline"),
        "{text}"
    );
    assert!(
        text.contains("fanout           level-50 0.90× (0.90–1.10, 3 rounds; of medians 1.10×)"),
        "{text}"
    );
    let json = serde_json::to_value(&rep).unwrap_or_default();
    assert_eq!(json["relative"][0]["per_round"]["n"], 3);
    let page = html::html(&rep, "{}");
    assert!(
        page.contains("CPU per request beside hyper-baseline"),
        "html"
    );
}

#[test]
fn a_run_without_a_baseline_has_no_relative_figures() {
    let trials = vec![
        trial("fanout", "level-50", 50.0, 5.0, 0.2),
        trial("fanout-percore", "level-50", 50.0, 5.0, 0.2),
    ];
    let rep = report(
        &["fanout", "fanout-percore"],
        &[("fanout", 100.0), ("fanout-percore", 100.0)],
        trials,
    );
    assert!(rep.relative.is_empty(), "{:?}", rep.relative);
    assert!(!text::text_summary(&rep).contains("CPU per request beside"));
    let json = serde_json::to_value(&rep).unwrap_or_default();
    assert!(json.get("relative").is_none(), "{json}");
}
