//! The records database's write path: 5,000 registrations of one name (a service
//! with 5,000 instances) against 5,000 registrations of distinct names, and the
//! DNS answer latency for another name while the one-name registrations run.
//!
//! The edit path changes a name's records in place and recomputes only the records
//! of the touched address (a large name keeps an index of positions by address and
//! id), so adding the k-th instance of a name costs O(1) amortised and the two
//! cases should take about as long; before, every edit rewrote the whole name (the
//! one-name case grew with the square of its size, 31x the distinct names at 5,000).
//! Besides criterion's figures, the bench interleaves both cases in rounds and
//! prints the one-name / distinct-names ratio of their medians (the goal is at most
//! 1.5x), then the p50/p99 of `QueryHandler` answers for another name with no writer
//! and with the one-name writer running on another thread.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use dwara_nameserver::{Db, DbConfig, Domain, QueryHandler};

const N: u32 = 5_000;

fn db() -> Db {
    Db::new(DbConfig::new(Domain::new("weave.local").unwrap()))
}

fn addr(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
}

/// `N` instances of `svc.weave.local`, one container and address each.
fn one_name(db: &Db) {
    for i in 0..N {
        db.add(&format!("c{i}"), addr(i), "svc.weave.local")
            .unwrap();
    }
}

/// `N` names, one container and address each.
fn distinct_names(db: &Db) {
    for i in 0..N {
        db.add(&format!("c{i}"), addr(i), &format!("n{i}.weave.local"))
            .unwrap();
    }
}

fn criterion_figures(c: &mut Criterion) {
    let mut group = c.benchmark_group("records_edit_5000");
    group.sample_size(10);
    group.bench_function("distinct_names", |b| {
        b.iter_batched(db, |db| distinct_names(&db), BatchSize::PerIteration);
    });
    group.bench_function("one_name", |b| {
        b.iter_batched(db, |db| one_name(&db), BatchSize::PerIteration);
    });
    group.finish();
}

fn timed(f: fn(&Db)) -> Duration {
    let db = db();
    let started = Instant::now();
    f(&db);
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Both cases in alternating rounds, so they share the machine's load.
fn interleaved_ratio() {
    const ROUNDS: usize = 15;
    let (mut one, mut distinct) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        distinct.push(timed(distinct_names));
        one.push(timed(one_name));
    }
    let (o, d) = (median(one), median(distinct));
    println!(
        "\nrecords_edit, {N} registrations, median of {ROUNDS} interleaved rounds: \
         one name {:.1} ms, distinct names {:.1} ms: one / distinct = {:.2}x",
        o.as_secs_f64() * 1e3,
        d.as_secs_f64() * 1e3,
        o.as_secs_f64() / d.as_secs_f64()
    );
}

/// An A query for `other.weave.local` (id 0x1234, RD).
fn query() -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(b"\x05other\x05weave\x05local\x00\x00\x01\x00\x01");
    q
}

/// Answer latencies for another name, one query at a time until `stop`.
fn answer_latencies(db: &Db, stop: &AtomicBool, at_least: usize) -> Vec<Duration> {
    let mut handler = QueryHandler::new(db);
    let q = query();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) || out.len() < at_least {
        let started = Instant::now();
        let answer = handler.answer_udp(&q).expect("an answer");
        std::hint::black_box(answer);
        out.push(started.elapsed());
    }
    out
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

/// p50/p99 of answers for another name, idle and while one name grows to `N`.
fn other_names_latency() {
    let db = db();
    db.add("other", addr(N + 1), "other.weave.local").unwrap();
    let stop = AtomicBool::new(true);
    let mut idle = answer_latencies(&db, &stop, 200_000);
    let stop = AtomicBool::new(false);
    let mut busy = std::thread::scope(|s| {
        let reader = s.spawn(|| answer_latencies(&db, &stop, 0));
        one_name(&db);
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap()
    });
    let line = |what: &str, v: &mut Vec<Duration>| {
        let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
        println!(
            "  {what:<40} {:>8} answers  p50 {:>6.2} µs  p99 {:>6.2} µs",
            v.len(),
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    };
    println!("answers for other.weave.local (QueryHandler, one thread):");
    line("idle", &mut idle);
    line(
        &format!("while {N} registrations of one name run"),
        &mut busy,
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_figures(&mut c);
    c.final_summary();
    interleaved_ratio();
    other_names_latency();
}
