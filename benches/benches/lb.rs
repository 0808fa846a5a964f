//! `dwara-lb` pick cost per policy beside floors measured in the same run.
//!
//! Baselines: a bare `AtomicUsize` round robin over a slice (the floor: the least a
//! shared picker can do), the same behind an arc-swapped snapshot with an
//! `Arc`-counted guard (the structural floor of any picker built like ours) and a
//! `Mutex<Vec>` round robin (the obvious locked picker). A counted pick (`pick`,
//! `pick_by_key`) includes what a proxy pays: the snapshot load, the policy, the
//! guard's in-flight count and its drop. The `_handle` pickers pick through an
//! `LbHandle` of the thread's own (cached snapshot, own round-robin position);
//! `_handle_uncounted` ones call `pick_endpoint`, which counts nothing in flight
//! and returns `&Endpoint`, the same work as the floor plus the snapshot and
//! ejection checks. After criterion has run, the medians are read back from
//! criterion's output and printed as a table of ratios to the floor.
//!
//! Run: `cargo bench -p dwara-benches --bench lb -- --warm-up-time 1 --measurement-time 2`

#![allow(clippy::print_stdout, reason = "a benchmark report")]

use std::cell::Cell;
use std::hint::black_box;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion};
use dwara_lb::{Endpoint, EndpointSet, Policy, UpstreamLb};

const SIZES: [usize; 3] = [10, 100, 1000];

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 8080))
}

fn uniform(n: usize) -> EndpointSet {
    (0..n).map(addr).collect()
}

/// Weights 1..=10 cycling, priorities 0 and 1 alternating (SRV uses half the set).
fn weighted(n: usize) -> EndpointSet {
    (0..n)
        .map(|i| {
            Endpoint::new(addr(i))
                .with_weight(1 + (i % 10) as u16)
                .with_priority((i % 2) as u16)
        })
        .collect()
}

/// The floor: a bare atomic round robin over a slice.
struct Floor {
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
}

impl Floor {
    fn pick(&self) -> &Endpoint {
        &self.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len()]
    }
}

/// The structural floor: what any picker with an arc-swapped snapshot and a guard
/// that counts in flight must pay: the snapshot load, an atomic round robin, one
/// reference-count increment and its decrement. No policy, no ejection check.
struct SwapGuardFloor {
    snapshot: ArcSwap<Vec<(Endpoint, Arc<()>)>>,
    next: AtomicUsize,
}

impl SwapGuardFloor {
    fn pick(&self) -> (Endpoint, Arc<()>) {
        let snap = self.snapshot.load();
        let (e, count) = &snap[self.next.fetch_add(1, Ordering::Relaxed) % snap.len()];
        (*e, Arc::clone(count))
    }
}

/// The locked picker: round robin under a `Mutex<Vec>`.
struct Locked {
    inner: Mutex<(Vec<Endpoint>, usize)>,
}

impl Locked {
    fn pick(&self) -> Endpoint {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (eps, next) = &mut *g;
        *next = next.wrapping_add(1);
        eps[*next % eps.len()]
    }
}

/// Keys for the consistent-hash picks, as a proxy would pass (a client address or a
/// header value).
fn keys() -> Vec<[u8; 16]> {
    (0..4096u64)
        .map(|k| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&k.to_le_bytes());
            b[8..].copy_from_slice(b"-session");
            b
        })
        .collect()
}

/// One thread's picker: picks once with the argument as a key index.
type PickFn = Box<dyn FnMut(usize)>;

/// A named picker under test. Every thread that picks makes its own `PickFn` (shared
/// pickers share their state through an `Arc`; a handle is one per thread).
struct Case {
    name: &'static str,
    make: Box<dyn Fn() -> PickFn + Send + Sync>,
}

impl Case {
    fn new(name: &'static str, make: impl Fn() -> PickFn + Send + Sync + 'static) -> Self {
        Self {
            name,
            make: Box::new(make),
        }
    }
}

/// How a case picks from an `UpstreamLb`.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    /// `UpstreamLb::pick` (or `pick_by_key`): a guard, through the shared snapshot.
    Shared,
    /// `LbHandle::pick`: a guard, through a handle of the thread's own.
    Handle,
    /// `LbHandle::pick_endpoint`: through a handle, nothing counted in flight.
    HandleUncounted,
}

fn lb_case(name: &'static str, policy: Policy, set: EndpointSet, via: Via) -> Case {
    let lb = Arc::new(UpstreamLb::builder(policy).seed(1).endpoints(set).build());
    let keys: Arc<[[u8; 16]]> = keys().into();
    let keyed = policy == Policy::ConsistentHash;
    Case::new(name, move || {
        via_pick(&lb, keyed.then(|| keys.clone()), via)
    })
}

/// One thread's picker on `lb` the `via` way: by key (the keys in turn) when there
/// are keys, else without.
fn via_pick(lb: &Arc<UpstreamLb>, keys: Option<Arc<[[u8; 16]]>>, via: Via) -> PickFn {
    match via {
        Via::Shared => pick_fn(
            lb.clone(),
            keys,
            |lb, k| drop(black_box(lb.pick_by_key(k))),
            |lb| drop(black_box(lb.pick())),
        ),
        Via::Handle => pick_fn(
            lb.handle(),
            keys,
            |h, k| drop(black_box(h.pick_by_key(k))),
            |h| drop(black_box(h.pick())),
        ),
        Via::HandleUncounted => pick_fn(
            lb.handle(),
            keys,
            |h, k| {
                let _ = black_box(h.pick_endpoint_by_key(k));
            },
            |h| {
                let _ = black_box(h.pick_endpoint());
            },
        ),
    }
}

/// A pick closure over `state`: `by_key` with the keys in turn when there are keys,
/// else `plain`. Generic, so each case compiles to its own closure with the pick
/// inlined and no branch per pick.
fn pick_fn<S: 'static>(
    mut state: S,
    keys: Option<Arc<[[u8; 16]]>>,
    mut by_key: impl FnMut(&mut S, &[u8]) + 'static,
    mut plain: impl FnMut(&mut S) + 'static,
) -> PickFn {
    match keys {
        Some(keys) => Box::new(move |i| by_key(&mut state, &keys[i % keys.len()])),
        None => Box::new(move |_| plain(&mut state)),
    }
}

/// Every picker, in report order: the three baselines first.
const NAMES: [&str; 15] = [
    "floor_atomic_rr",
    "floor_swap_guard",
    "mutex_vec_rr",
    "round_robin",
    "round_robin_handle",
    "round_robin_handle_uncounted",
    "round_robin_weighted",
    "random",
    "random_weighted",
    "p2c",
    "p2c_handle",
    "srv",
    "consistent_hash",
    "consistent_hash_handle",
    "consistent_hash_handle_uncounted",
];

fn cases(n: usize) -> Vec<Case> {
    let floor = Arc::new(Floor {
        endpoints: uniform(n).as_slice().to_vec(),
        next: AtomicUsize::new(0),
    });
    let locked = Arc::new(Locked {
        inner: Mutex::new((uniform(n).as_slice().to_vec(), 0)),
    });
    let swap_guard = Arc::new(SwapGuardFloor {
        snapshot: ArcSwap::from_pointee(uniform(n).iter().map(|e| (*e, Arc::new(()))).collect()),
        next: AtomicUsize::new(0),
    });
    let cases = vec![
        Case::new("floor_atomic_rr", move || -> PickFn {
            let floor = floor.clone();
            Box::new(move |_| {
                black_box(floor.pick());
            })
        }),
        Case::new("floor_swap_guard", move || -> PickFn {
            let swap_guard = swap_guard.clone();
            Box::new(move |_| {
                black_box(swap_guard.pick());
            })
        }),
        Case::new("mutex_vec_rr", move || -> PickFn {
            let locked = locked.clone();
            Box::new(move |_| {
                black_box(locked.pick());
            })
        }),
        lb_case("round_robin", Policy::RoundRobin, uniform(n), Via::Shared),
        lb_case(
            "round_robin_handle",
            Policy::RoundRobin,
            uniform(n),
            Via::Handle,
        ),
        lb_case(
            "round_robin_handle_uncounted",
            Policy::RoundRobin,
            uniform(n),
            Via::HandleUncounted,
        ),
        lb_case(
            "round_robin_weighted",
            Policy::RoundRobin,
            weighted(n),
            Via::Shared,
        ),
        lb_case("random", Policy::Random, uniform(n), Via::Shared),
        lb_case("random_weighted", Policy::Random, weighted(n), Via::Shared),
        lb_case("p2c", Policy::P2c, uniform(n), Via::Shared),
        lb_case("p2c_handle", Policy::P2c, uniform(n), Via::Handle),
        lb_case("srv", Policy::Srv, weighted(n), Via::Shared),
        lb_case(
            "consistent_hash",
            Policy::ConsistentHash,
            uniform(n),
            Via::Shared,
        ),
        lb_case(
            "consistent_hash_handle",
            Policy::ConsistentHash,
            uniform(n),
            Via::Handle,
        ),
        lb_case(
            "consistent_hash_handle_uncounted",
            Policy::ConsistentHash,
            uniform(n),
            Via::HandleUncounted,
        ),
    ];
    debug_assert!(cases.iter().map(|c| c.name).eq(NAMES));
    cases
}

fn bench_one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick_1t");
    for n in SIZES {
        for case in cases(n) {
            group.bench_function(BenchmarkId::new(case.name, n), |b| {
                let mut pick = (case.make)();
                let mut i = 0usize;
                b.iter(|| {
                    i = i.wrapping_add(1);
                    pick(i);
                });
            });
        }
    }
    group.finish();
}

/// Two threads pick concurrently from the same picker; the time reported is wall
/// time per pick per thread.
fn bench_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick_2t");
    for n in SIZES {
        for case in cases(n) {
            group.bench_function(BenchmarkId::new(case.name, n), |b| {
                b.iter_custom(|iters| {
                    let barrier = Barrier::new(2);
                    let run = |offset: usize| {
                        let mut pick = (case.make)();
                        barrier.wait();
                        let start = Instant::now();
                        for i in 0..iters as usize {
                            pick(i.wrapping_add(offset));
                        }
                        start.elapsed()
                    };
                    thread::scope(|s| {
                        let other = s.spawn(|| run(1 << 20));
                        let mine = run(0);
                        mine.max(other.join().unwrap_or(mine))
                    })
                });
            });
        }
    }
    group.finish();
}

/// The pickers measured while sets are swapped: counted picks by key (only
/// consistent hash looks at the key).
const SWAP_CASES: [(&str, Policy, Via); 4] = [
    ("round_robin", Policy::RoundRobin, Via::Shared),
    ("round_robin_handle", Policy::RoundRobin, Via::Handle),
    ("p2c", Policy::P2c, Via::Shared),
    ("consistent_hash", Policy::ConsistentHash, Via::Shared),
];

/// Pick latency while another thread swaps the set as fast as it can, beside the
/// same pick with no writer.
fn bench_swapping(c: &mut Criterion) {
    let mut group = c.benchmark_group("swap");
    let n = 100;
    for (name, policy, via) in SWAP_CASES {
        let lb = Arc::new(
            UpstreamLb::builder(policy)
                .seed(1)
                .endpoints(uniform(n))
                .build(),
        );
        let keys: Arc<[[u8; 16]]> = keys().into();
        let pick_loop = |id: BenchmarkId, group: &mut criterion::BenchmarkGroup<'_, _>| {
            group.bench_function(id, |b| {
                let mut pick = via_pick(&lb, Some(keys.clone()), via);
                let mut i = 0usize;
                b.iter(|| {
                    i = i.wrapping_add(1);
                    pick(i);
                });
            });
        };
        pick_loop(BenchmarkId::new(name, "quiet"), &mut group);
        // flat out, then one set per millisecond (still far above DNS refresh rates)
        for (label, pause) in [
            ("swapping", Duration::ZERO),
            ("swapping_1ms", Duration::from_millis(1)),
        ] {
            let stop = Arc::new(AtomicBool::new(false));
            let swaps = Arc::new(AtomicUsize::new(0));
            let writer = {
                let (lb, stop, swaps) = (lb.clone(), stop.clone(), swaps.clone());
                // two sets that differ in one endpoint, as a DNS refresh would
                let a = uniform(n);
                let b: EndpointSet = (1..=n).map(addr).collect();
                thread::spawn(move || {
                    let mut flip = false;
                    while !stop.load(Ordering::Relaxed) {
                        flip = !flip;
                        lb.update(if flip { a.clone() } else { b.clone() });
                        swaps.fetch_add(1, Ordering::Relaxed);
                        if !pause.is_zero() {
                            thread::sleep(pause);
                        }
                    }
                })
            };
            let started = Instant::now();
            pick_loop(BenchmarkId::new(name, label), &mut group);
            stop.store(true, Ordering::Relaxed);
            let _ = writer.join();
            let rate = swaps.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
            if rate > 1.0 {
                println!(
                    "swap/{name}/{label}: the writer published {rate:.0} sets/s while picks ran"
                );
            }
        }
    }
    group.finish();
}

/// The cost of publishing a set (building the policy's state), off the pick path.
fn bench_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("update");
    for policy in Policy::ALL {
        let n = 1000;
        let lb = UpstreamLb::builder(policy).endpoints(weighted(n)).build();
        let a = weighted(n);
        let b: EndpointSet = weighted(n + 1).iter().skip(1).copied().collect();
        // criterion calls the routine once per sample: the alternation must outlive it
        let flip = Cell::new(false);
        group.bench_function(BenchmarkId::new(policy.as_str(), n), |bench| {
            bench.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    flip.set(!flip.get());
                    let next = if flip.get() { b.clone() } else { a.clone() };
                    let start = Instant::now();
                    let changed = lb.update(next);
                    spent += start.elapsed();
                    assert!(changed, "every update publishes");
                }
                spent
            });
        });
    }
    group.finish();
}

fn output_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("criterion")
}

/// The median (ns) criterion measured for `id` in this run, if it ran.
fn median(dir: &Path, id: &str, since: SystemTime) -> Option<f64> {
    let path = dir.join(id).join("new/estimates.json");
    let fresh = std::fs::metadata(&path).ok()?.modified().ok()? >= since;
    if !fresh {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn fmt_cell(v: Option<f64>, floor: Option<f64>) -> String {
    match (v, floor) {
        (Some(v), Some(f)) => format!("{v:.1} ns ({:.1}×)", v / f),
        (Some(v), None) => format!("{v:.1} ns"),
        _ => "–".to_owned(),
    }
}

fn fmt_cell2(v: Option<f64>, floor: Option<f64>, structural: Option<f64>) -> String {
    match (v, floor, structural) {
        (Some(v), Some(f), Some(s)) => format!("{v:.1} ns ({:.1}× / {:.1}×)", v / f, v / s),
        _ => fmt_cell(v, floor),
    }
}

fn report(dir: &Path, since: SystemTime) {
    for group in ["pick_1t", "pick_2t"] {
        let floors: Vec<Option<f64>> = SIZES
            .iter()
            .map(|n| median(dir, &format!("{group}/floor_atomic_rr/{n}"), since))
            .collect();
        let structural: Vec<Option<f64>> = SIZES
            .iter()
            .map(|n| median(dir, &format!("{group}/floor_swap_guard/{n}"), since))
            .collect();
        if floors.iter().all(Option::is_none) {
            continue;
        }
        println!(
            "\n{group}: median per pick (ratio to floor_atomic_rr / to floor_swap_guard, same size)\n"
        );
        println!("| picker | 10 | 100 | 1000 |\n|---|---|---|---|");
        for name in NAMES {
            let cells: Vec<String> = SIZES
                .iter()
                .zip(floors.iter().zip(&structural))
                .map(|(n, (&f, &s))| {
                    fmt_cell2(median(dir, &format!("{group}/{name}/{n}"), since), f, s)
                })
                .collect();
            println!("| {name} | {} |", cells.join(" | "));
        }
    }
    let mut printed = false;
    for (name, _, _) in SWAP_CASES {
        let quiet = median(dir, &format!("swap/{name}/quiet"), since);
        let busy = median(dir, &format!("swap/{name}/swapping"), since);
        let paced = median(dir, &format!("swap/{name}/swapping_1ms"), since);
        if quiet.is_none() && busy.is_none() {
            continue;
        }
        if !printed {
            println!("\nswap (100 endpoints): pick while another thread swaps sets\n");
            println!(
                "| policy | quiet | swapping flat out (ratio) | one set per ms (ratio) |\n|---|---|---|---|"
            );
            printed = true;
        }
        println!(
            "| {name} | {} | {} | {} |",
            fmt_cell(quiet, None),
            fmt_cell(busy, quiet),
            fmt_cell(paced, quiet)
        );
    }
    let mut printed = false;
    for policy in Policy::ALL {
        if let Some(v) = median(dir, &format!("update/{}/1000", policy.as_str()), since) {
            if !printed {
                println!("\nupdate (1000 endpoints): publishing a set\n");
                println!("| policy | time |\n|---|---|");
                printed = true;
            }
            println!("| {policy} | {:.2} ms |", v / 1e6);
        }
    }
}

/// Criterion measures one benchmark after another, so on a shared, loaded machine the
/// floor and a policy can see different loads. This pass interleaves them: in each
/// round every picker runs one batch, and the per-pick time of each picker is taken
/// as the minimum (and the median) over rounds, so the ratios compare like with like.
fn interleaved() {
    const ROUNDS: usize = 25;
    const BATCH: usize = 100_000;
    let time_batch = |pick: &mut PickFn| {
        let start = Instant::now();
        for i in 0..BATCH {
            pick(i);
        }
        start.elapsed().as_secs_f64() * 1e9 / BATCH as f64
    };
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    println!(
        "\ninterleaved (1 thread, {ROUNDS} rounds of {BATCH} picks): min ns [ratio to floor_atomic_rr / to floor_swap_guard], median ns\n"
    );
    println!("| picker | 10 | 100 | 1000 |\n|---|---|---|---|");
    let mut columns: Vec<Vec<(&'static str, (f64, f64))>> = Vec::new();
    for n in SIZES {
        let cases = cases(n);
        let mut picks: Vec<PickFn> = cases.iter().map(|c| (c.make)()).collect();
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        for _ in 0..ROUNDS {
            for (pick, s) in picks.iter_mut().zip(&mut samples) {
                s.push(time_batch(pick));
            }
        }
        columns.push(
            cases
                .iter()
                .zip(samples)
                .map(|(c, s)| (c.name, stats(s)))
                .collect(),
        );
    }
    let rows = columns.first().map_or(0, Vec::len);
    for r in 0..rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|col| {
                let (floor, guard) = (col[0].1.0, col[1].1.0);
                let (min, median) = col[r].1;
                format!(
                    "{min:.1} [{:.1}× / {:.1}×], {median:.1}",
                    min / floor,
                    min / guard
                )
            })
            .collect();
        println!("| {} | {} |", columns[0][r].0, cells.join(" | "));
    }

    // pick latency with and without a writer swapping sets, rounds alternating
    println!(
        "\ninterleaved swap (100 endpoints, {ROUNDS} rounds): min ns quiet → swapping [ratio], medians\n"
    );
    println!(
        "| policy | quiet | swapping | ratio (min) | ratio (median) | sets published per batch |\n|---|---|---|---|---|---|"
    );
    let n = 100;
    for (name, policy, via) in SWAP_CASES {
        let lb = Arc::new(
            UpstreamLb::builder(policy)
                .seed(1)
                .endpoints(uniform(n))
                .build(),
        );
        let mut pick = via_pick(&lb, Some(keys().into()), via);
        let active = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (lb, active, stop, swaps) =
                (lb.clone(), active.clone(), stop.clone(), swaps.clone());
            let a = uniform(n);
            let b: EndpointSet = (1..=n).map(addr).collect();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if active.load(Ordering::Relaxed) {
                        lb.update(a.clone());
                        lb.update(b.clone());
                        swaps.fetch_add(2, Ordering::Relaxed);
                    } else {
                        thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        };
        let (mut quiet, mut busy) = (Vec::new(), Vec::new());
        let mut swapped_during = 0usize;
        for _ in 0..ROUNDS {
            active.store(false, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(1));
            let start = Instant::now();
            for i in 0..BATCH {
                pick(i);
            }
            quiet.push(start.elapsed().as_secs_f64() * 1e9 / BATCH as f64);
            let before = swaps.load(Ordering::Relaxed);
            active.store(true, Ordering::Relaxed);
            while swaps.load(Ordering::Relaxed) == before {
                thread::yield_now();
            }
            let (start, at) = (Instant::now(), swaps.load(Ordering::Relaxed));
            for i in 0..BATCH {
                pick(i);
            }
            busy.push(start.elapsed().as_secs_f64() * 1e9 / BATCH as f64);
            swapped_during += swaps.load(Ordering::Relaxed) - at;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = writer.join();
        let ((qmin, qmed), (bmin, bmed)) = (stats(quiet), stats(busy));
        println!(
            "| {name} | {qmin:.1} ({qmed:.1}) | {bmin:.1} ({bmed:.1}) | {:.2}× | {:.2}× | {:.0} |",
            bmin / qmin,
            bmed / qmed,
            swapped_during as f64 / ROUNDS as f64
        );
    }
}

/// The name filter given on the command line, if any (criterion's own flags and
/// their values skipped).
fn filter_arg() -> Option<String> {
    const WITH_VALUE: [&str; 16] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--nresamples",
        "--output-format",
        "--profile-time",
        "--plotting-backend",
        "--color",
        "--format",
    ];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if WITH_VALUE.contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            return Some(a);
        }
    }
    None
}

fn main() {
    let since = SystemTime::now()
        .checked_sub(Duration::from_secs(1))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let dir = output_dir();
    let mut c = Criterion::default()
        .output_directory(&dir)
        .configure_from_args();
    bench_one_thread(&mut c);
    bench_two_threads(&mut c);
    bench_swapping(&mut c);
    bench_update(&mut c);
    c.final_summary();
    report(&dir, since);
    // `--list`, `--test` and filters that do not ask for it skip the interleaved pass
    let listing = std::env::args().any(|a| a == "--list" || a == "--test");
    if !listing && filter_arg().is_none_or(|f| f.contains("interleaved")) {
        interleaved();
    }
}
