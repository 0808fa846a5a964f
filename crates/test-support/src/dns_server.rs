//! An in-process, controllable DNS server for tests, built on hickory-server.
//!
//! It binds UDP and TCP on `127.0.0.1` with an ephemeral port and answers from a
//! record table the test edits while it runs: A, AAAA and SRV records with their own
//! TTLs, authoritative NXDOMAIN (unknown name) and NODATA (known name, other type)
//! with an SOA whose minimum is the negative TTL. A failure mode (SERVFAIL, REFUSED,
//! silent drop) and an answer delay can be switched at any time. Every query is
//! counted, in total and per name, and a test can await the next query.
//!
//! SRV answers carry no additional records on purpose: resolvers must resolve SRV
//! targets themselves, which is what hickory does not always spare them in the wild.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::op::{Metadata, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo, Server};
use hickory_server::zone_handler::MessageResponseBuilder;
use parking_lot::Mutex;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Notify;

/// How the server treats every query while the mode is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Answer from the record table.
    #[default]
    Answer,
    /// Reply SERVFAIL.
    ServFail,
    /// Reply REFUSED.
    Refused,
    /// Never reply (the client times out).
    Drop,
}

/// One SRV record: the target must be given A/AAAA records separately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvRecord {
    /// RFC 2782 priority (lower is preferred).
    pub priority: u16,
    /// RFC 2782 weight within a priority.
    pub weight: u16,
    /// Port of the service.
    pub port: u16,
    /// Target host name (absolute).
    pub target: String,
}

#[derive(Default)]
struct Entry {
    a: Option<(Vec<Ipv4Addr>, u32)>,
    aaaa: Option<(Vec<Ipv6Addr>, u32)>,
    srv: Option<(Vec<SrvRecord>, u32)>,
}

struct State {
    records: Mutex<HashMap<String, Entry>>,
    mode: Mutex<FailureMode>,
    delay: Mutex<Duration>,
    negative_ttl: AtomicU64,
    queries: AtomicU64,
    per_name: Mutex<HashMap<String, u64>>,
    queried: Notify,
}

/// The test DNS server. Dropping it stops serving.
pub struct TestDnsServer {
    addr: SocketAddr,
    state: Arc<State>,
    server: Server<Handler>,
}

impl std::fmt::Debug for TestDnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDnsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

fn key(name: &str) -> String {
    let mut k = name.trim_end_matches('.').to_ascii_lowercase();
    k.push('.');
    k
}

impl TestDnsServer {
    /// Binds UDP and TCP on one ephemeral loopback port and starts serving.
    pub async fn start() -> io::Result<Self> {
        // Bind TCP first on port 0, then UDP on the same port; retry on the rare clash.
        let (udp, tcp) = loop {
            let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            let port = tcp.local_addr()?.port();
            match UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).await {
                Ok(udp) => break (udp, tcp),
                Err(_) => continue,
            }
        };
        let addr = udp.local_addr()?;
        let state = Arc::new(State {
            records: Mutex::new(HashMap::new()),
            mode: Mutex::new(FailureMode::Answer),
            delay: Mutex::new(Duration::ZERO),
            negative_ttl: AtomicU64::new(5),
            queries: AtomicU64::new(0),
            per_name: Mutex::new(HashMap::new()),
            queried: Notify::new(),
        });
        let mut server = Server::new(Handler {
            state: state.clone(),
        });
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5), 64);
        Ok(Self {
            addr,
            state,
            server,
        })
    }

    /// The UDP and TCP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the A records of `name` (TTL in seconds). An empty list removes them.
    pub fn set_a(&self, name: &str, ips: &[Ipv4Addr], ttl: u32) {
        let mut records = self.state.records.lock();
        let entry = records.entry(key(name)).or_default();
        entry.a = (!ips.is_empty()).then(|| (ips.to_vec(), ttl));
    }

    /// Replaces the AAAA records of `name`. An empty list removes them.
    pub fn set_aaaa(&self, name: &str, ips: &[Ipv6Addr], ttl: u32) {
        let mut records = self.state.records.lock();
        let entry = records.entry(key(name)).or_default();
        entry.aaaa = (!ips.is_empty()).then(|| (ips.to_vec(), ttl));
    }

    /// Replaces the SRV records of `name`. An empty list removes them.
    pub fn set_srv(&self, name: &str, targets: &[SrvRecord], ttl: u32) {
        let mut records = self.state.records.lock();
        let entry = records.entry(key(name)).or_default();
        entry.srv = (!targets.is_empty()).then(|| (targets.to_vec(), ttl));
    }

    /// Removes every record of `name`: it answers NXDOMAIN from now on.
    pub fn remove(&self, name: &str) {
        self.state.records.lock().remove(&key(name));
    }

    /// Sets the negative TTL (the SOA minimum in NXDOMAIN/NODATA answers).
    pub fn set_negative_ttl(&self, ttl: u32) {
        self.state
            .negative_ttl
            .store(u64::from(ttl), Ordering::Relaxed);
    }

    /// Switches the failure mode for every following query.
    pub fn set_failure(&self, mode: FailureMode) {
        *self.state.mode.lock() = mode;
    }

    /// Delays every following answer by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock() = delay;
    }

    /// Queries received so far (all names, all types, answered or not).
    pub fn query_count(&self) -> u64 {
        self.state.queries.load(Ordering::SeqCst)
    }

    /// Queries received so far for `name` (any type).
    pub fn query_count_for(&self, name: &str) -> u64 {
        self.state
            .per_name
            .lock()
            .get(&key(name))
            .copied()
            .unwrap_or(0)
    }

    /// Waits until at least `n` queries in total have arrived, or `timeout` passes.
    /// Returns whether they arrived.
    pub async fn wait_for_queries(&self, n: u64, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.state.queried.notified();
            if self.query_count() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.query_count() >= n;
            }
        }
    }

    /// Stops serving now (the port is released).
    pub async fn shutdown(mut self) {
        let _ = self.server.shutdown_gracefully().await;
    }
}

impl Drop for TestDnsServer {
    fn drop(&mut self) {
        self.server.shutdown_token().cancel();
    }
}

struct Handler {
    state: Arc<State>,
}

impl Handler {
    fn soa(&self, zone: &Name) -> Record {
        let minimum =
            u32::try_from(self.state.negative_ttl.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        let mname = Name::from_ascii("ns.test.").expect("static name");
        let rname = Name::from_ascii("hostmaster.test.").expect("static name");
        Record::from_rdata(
            zone.clone(),
            minimum,
            RData::SOA(SOA::new(mname, rname, 1, 3600, 600, 86400, minimum)),
        )
    }

    /// Builds the answer records for one question, or the negative response code.
    fn answer(&self, qname: &Name, qtype: RecordType) -> Result<Vec<Record>, ResponseCode> {
        let records = self.state.records.lock();
        let Some(entry) = records.get(&key(&qname.to_ascii())) else {
            return Err(ResponseCode::NXDomain);
        };
        if entry.a.is_none() && entry.aaaa.is_none() && entry.srv.is_none() {
            return Err(ResponseCode::NXDomain);
        }
        let name = qname.clone();
        let out = match qtype {
            RecordType::A => entry.a.as_ref().map(|(ips, ttl)| {
                ips.iter()
                    .map(|ip| Record::from_rdata(name.clone(), *ttl, RData::A(A(*ip))))
                    .collect()
            }),
            RecordType::AAAA => entry.aaaa.as_ref().map(|(ips, ttl)| {
                ips.iter()
                    .map(|ip| Record::from_rdata(name.clone(), *ttl, RData::AAAA(AAAA(*ip))))
                    .collect()
            }),
            RecordType::SRV => entry.srv.as_ref().map(|(targets, ttl)| {
                targets
                    .iter()
                    .filter_map(|t| {
                        let target = Name::from_ascii(&t.target).ok()?;
                        Some(Record::from_rdata(
                            name.clone(),
                            *ttl,
                            RData::SRV(SRV::new(t.priority, t.weight, t.port, target)),
                        ))
                    })
                    .collect()
            }),
            _ => None,
        };
        Ok(out.unwrap_or_default())
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        self.state.queries.fetch_add(1, Ordering::SeqCst);
        let query = request.queries.queries().first().map(|q| {
            let name: Name = q.name().into();
            (name, q.query_type())
        });
        if let Some((name, _)) = &query {
            *self
                .state
                .per_name
                .lock()
                .entry(key(&name.to_ascii()))
                .or_default() += 1;
        }
        self.state.queried.notify_waiters();

        let mode = *self.state.mode.lock();
        let delay = *self.state.delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut metadata = Metadata::response_from_request(&request.metadata);
        let builder = MessageResponseBuilder::from_message_request(request);
        let code = match mode {
            FailureMode::Drop => {
                // Nothing is sent: the client sees a timeout.
                return ResponseInfo::from(hickory_proto::op::Header {
                    metadata,
                    counts: Default::default(),
                });
            }
            FailureMode::ServFail => Some(ResponseCode::ServFail),
            FailureMode::Refused => Some(ResponseCode::Refused),
            FailureMode::Answer => None,
        };
        let result = match (code, query) {
            (Some(code), _) => {
                response_handle
                    .send_response(builder.error_msg(&request.metadata, code))
                    .await
            }
            (None, None) => {
                response_handle
                    .send_response(builder.error_msg(&request.metadata, ResponseCode::FormErr))
                    .await
            }
            (None, Some((name, qtype))) => {
                metadata.authoritative = true;
                match self.answer(&name, qtype) {
                    Ok(answers) if !answers.is_empty() => {
                        response_handle
                            .send_response(builder.build(metadata, &answers, [], [], []))
                            .await
                    }
                    Ok(_) => {
                        let soa = [self.soa(&name)];
                        response_handle
                            .send_response(builder.build(metadata, [], [], &soa, []))
                            .await
                    }
                    Err(rcode) => {
                        metadata.response_code = rcode;
                        let soa = [self.soa(&name)];
                        response_handle
                            .send_response(builder.build(metadata, [], [], &soa, []))
                            .await
                    }
                }
            }
        };
        match result {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(error = %e, "test dns server: cannot send a response");
                ResponseInfo::from(hickory_proto::op::Header {
                    metadata,
                    counts: Default::default(),
                })
            }
        }
    }
}
