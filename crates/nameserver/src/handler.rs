//! Turns one DNS query into a response, a decision to forward, or nothing.
//!
//! The fast path (see `wire`) answers ordinary queries for local names from the
//! record tables: one lower-cased hash lookup, a copy of the question (so the owner
//! name, a compression pointer to it, echoes the query's case), 16 or 28 bytes per
//! address, a shuffle, the ID as received. NXDOMAIN and NODATA carry a prebuilt SOA.
//! No allocation, no logging, no task per packet.
//!
//! Everything unusual is decoded with hickory-proto: malformed packets get FORMERR,
//! other opcodes NOTIMP, EDNS versions above 0 BADVERS, several questions FORMERR;
//! a well-formed query with extra records is re-encoded in the ordinary form and
//! answered by the same code as the fast path.
//!
//! SRV: a query for `<service>.<name>` (two `_` labels, e.g. `_http._tcp.web.weave.local`)
//! is answered from the records of `<name>` that carry that service: one SRV record
//! per instance, i.e. per (address, port), with the registration's priority and
//! weight (0 and 1 unless set), in random order,
//! each targeting a name of its own, `<hex address>.addr.<domain>`
//! (`0a200001.addr.weave.local`), written out: RFC 2782 forbids compressing the
//! target, and Go's resolver refuses an answer that does. TC when not all fit. Then,
//! when all did, each target's A/AAAA record in the additional section (owner a
//! pointer to the target), A before AAAA, as many as fit (additional records never
//! set TC). A target answers A or AAAA with its one address (NODATA to other types)
//! while some name serves that address, and is NXDOMAIN otherwise; `addr.<domain>`
//! itself is an empty non-terminal (NODATA). A service name that exists answers
//! NODATA to other types; `_tcp.<name>` above an existing `_x._tcp.<name>` is an
//! empty non-terminal (NODATA); any other `_` name below the domain is NXDOMAIN
//! unless it is an empty non-terminal by the rule below.
//!
//! Empty non-terminals (RFC 8020): a name below the domain that answers nothing of
//! its own but has a name below it that is answered (`prod.weave.local` while
//! `api.prod.weave.local` has an answered record) is NODATA (NOERROR, no answer, the
//! SOA in authority) to every type, not NXDOMAIN, so resolvers that minimise query
//! names (RFC 9156) do not cut off the names below it. A name whose records are all
//! tombstones, hidden or not passing their checks does not count. The tables keep,
//! per ancestor, how many answered names are below it, so this costs one lookup on
//! the NXDOMAIN path only.
//!
//! Each worker (a UDP thread, a TCP connection) answers through a [`Worker`]: the
//! handler, its counters, its transport and its own state (the shuffling generator,
//! the list an SRV answer is ordered in), so answering allocates nothing once warm.
//!
//! EDNS: a query's OPT is answered with ours (version 0, payload 4096, no options, the
//! query's DO bit copied as RFC 3225 asks, every other flag clear), BADVERS included.
//!
//! Shuffling: the whole record set is shuffled per query (Fisher–Yates with a
//! per-worker xorshift generator) and, when it does not fit, cut after the shuffle,
//! so a truncated answer is a random subset.
//!
//! Response codes are [`Rcode`]s and header bits are named in `wire::flags`.

use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode};

use std::net::IpAddr;

use crate::metrics::Counters;
use crate::wire::{
    self, Answer, FastRng, HEADER_LEN, OPT_LEN, Parse, Query, Rcode, flags, rtype,
    write_bare_error, write_error, write_header, write_opt,
};
use dwara_records::Db;
use dwara_records::answers::{
    A_RR_LEN, AAAA_RR_LEN, PtrRef, Rec, Tables, parse_reverse, split_service, write_rr_head,
};

/// Largest DNS message (TCP); output buffers must hold this much.
pub(crate) const MAX_MESSAGE: usize = 65_535;

/// The address family of an A (IPv4) or AAAA (IPv6) answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    #[inline]
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// The label between an SRV target's address and the domain.
const ADDR_LABEL: &[u8] = b"\x04addr";

/// Length of an SRV record before its target: owner pointer, type, class, TTL,
/// length, priority, weight, port.
const SRV_FIXED_LEN: usize = 18;

/// The transport a query came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// UDP: responses limited to 512 bytes or the EDNS size, else truncated.
    Udp,
    /// TCP: up to 64 KiB.
    Tcp,
}

/// What to do with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Send `out[..len]`.
    Reply(usize),
    /// Not ours: forward to the fallback servers (the query's type for metrics).
    Forward {
        /// The query type.
        qtype: u16,
    },
    /// Send nothing.
    Drop,
}

/// A worker's own state (a UDP thread, a TCP connection, a [`crate::QueryHandler`]):
/// the generator answers are shuffled with and the list an SRV answer is put in order
/// in, kept between queries so that answering allocates nothing once warm.
#[derive(Debug, Clone)]
pub(crate) struct WorkerState {
    rng: FastRng,
    /// For an SRV answer: (index of the record, offset of its target in the message).
    order: Vec<(u32, u32)>,
}

impl WorkerState {
    /// Fresh state, the generator seeded from the operating system.
    pub(crate) fn new() -> Self {
        Self {
            rng: FastRng::new(),
            order: Vec::new(),
        }
    }

    /// Fresh state with a fixed seed (tests).
    #[cfg(test)]
    pub(crate) fn seeded(seed: u64) -> Self {
        Self {
            rng: FastRng::seeded(seed),
            order: Vec::new(),
        }
    }
}

/// What one worker answers with: the handler, the counters it adds to, the
/// transport its queries come over, and its own state.
#[derive(Debug)]
pub(crate) struct Worker<'a> {
    pub(crate) handler: &'a Handler,
    pub(crate) counters: &'a Counters,
    pub(crate) transport: Transport,
    pub(crate) state: &'a mut WorkerState,
}

impl Worker<'_> {
    /// Handles one query. `out` must hold at least [`MAX_MESSAGE`] bytes.
    #[inline]
    pub(crate) fn handle(&mut self, packet: &[u8], out: &mut [u8]) -> Outcome {
        let handler = self.handler;
        handler.handle(packet, out, self)
    }
}

/// The owner name of a record: a compression pointer, or the name written out.
#[derive(Debug, Clone, Copy)]
enum Owner<'a> {
    /// A pointer to the name at this offset of the message (below 0x4000).
    At(u16),
    /// The name in wire form.
    Name(&'a [u8]),
}

/// The question's name, which every answer record is owned by.
const QUESTION: Owner<'static> = Owner::At(HEADER_LEN as u16);

/// The query handler: the answer table plus the zone's fixed records.
#[derive(Debug)]
pub(crate) struct Handler {
    tables: Arc<Tables>,
    ttl: u32,
    domain: Box<[u8]>,
    /// `\x04addr` then the domain: the suffix of the SRV target names.
    addr_suffix: Box<[u8]>,
    /// The zone SOA for the authority section (owner = the domain).
    soa: Box<[u8]>,
    /// The same SOA as an answer to an apex SOA query (owner = pointer to question).
    soa_answer: Box<[u8]>,
}

enum Found {
    Reply(usize),
    Forward,
    Absent,
}

impl Handler {
    /// A handler answering from `db`'s table.
    pub(crate) fn new(db: &Db) -> Self {
        let domain: Box<[u8]> = db.domain().wire().into();
        let ttl = db.ttl();
        let mut rdata = Vec::new();
        rdata.extend_from_slice(b"\x02ns");
        rdata.extend_from_slice(&domain);
        rdata.extend_from_slice(b"\x0ahostmaster");
        rdata.extend_from_slice(&domain);
        // serial, refresh, retry, expire, minimum (negative-caching TTL).
        for v in [1u32, 3600, 600, 86_400, ttl] {
            rdata.extend_from_slice(&v.to_be_bytes());
        }
        let mut fixed = Vec::new();
        fixed.extend_from_slice(&rtype::SOA.to_be_bytes());
        fixed.extend_from_slice(&[0, 1]);
        fixed.extend_from_slice(&ttl.to_be_bytes());
        // Two names of at most 255 bytes plus 20: fits u16.
        fixed.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        fixed.extend_from_slice(&rdata);
        let soa = [&domain[..], &fixed].concat().into_boxed_slice();
        let soa_answer = [&[0xc0, 0x0c][..], &fixed].concat().into_boxed_slice();
        Self {
            tables: db.tables().clone(),
            ttl,
            addr_suffix: [ADDR_LABEL, &domain[..]].concat().into_boxed_slice(),
            domain,
            soa,
            soa_answer,
        }
    }

    /// Handles one query for `w`.
    #[inline]
    fn handle(&self, packet: &[u8], out: &mut [u8], w: &mut Worker<'_>) -> Outcome {
        let mut lower = [0u8; 256];
        match wire::parse(packet, &mut lower) {
            Parse::Fast(q) => self.answer(&q, &lower[..q.qname_len], out, w),
            Parse::Slow => self.slow(packet, out, w),
            Parse::Drop => {
                w.counters.dropped();
                Outcome::Drop
            }
        }
    }

    fn slow(&self, packet: &[u8], out: &mut [u8], w: &mut Worker<'_>) -> Outcome {
        let counters = w.counters;
        let reply_bare = |out: &mut [u8], rc: Rcode| match write_bare_error(packet, out, rc) {
            Some(n) => {
                counters.record(None, rc.code());
                Outcome::Reply(n)
            }
            None => {
                counters.dropped();
                Outcome::Drop
            }
        };
        let msg = match Message::from_vec(packet) {
            Ok(m) => m,
            Err(e) => {
                tracing::trace!(error = %e, len = packet.len(), "undecodable DNS packet");
                return reply_bare(out, Rcode::FORMERR);
            }
        };
        if msg.metadata.message_type == MessageType::Response {
            counters.dropped();
            return Outcome::Drop;
        }
        if msg.metadata.op_code != OpCode::Query {
            return reply_bare(out, Rcode::NOTIMP);
        }
        let [query] = msg.queries.as_slice() else {
            return reply_bare(out, Rcode::FORMERR);
        };
        // Re-encode as an ordinary query: header, the question (original case), OPT.
        let mut canon = Vec::with_capacity(HEADER_LEN + 260 + OPT_LEN);
        canon.extend_from_slice(&packet[..4]);
        canon.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(msg.edns.is_some())]);
        for label in query.name().iter() {
            canon.push(label.len() as u8);
            canon.extend_from_slice(label);
        }
        canon.push(0);
        canon.extend_from_slice(&u16::from(query.query_type()).to_be_bytes());
        canon.extend_from_slice(&u16::from(query.query_class()).to_be_bytes());
        let bad_version = msg.edns.as_ref().is_some_and(|e| e.version() > 0);
        if let Some(edns) = &msg.edns {
            let p = edns.max_payload().to_be_bytes();
            // Only the DO bit of the flags is kept: it is echoed (RFC 3225).
            let dnssec_ok = if edns.flags().dnssec_ok { flags::DO } else { 0 };
            canon.extend_from_slice(&[0, 0, 41, p[0], p[1], 0, 0, dnssec_ok, 0, 0, 0]);
        }
        let mut lower = [0u8; 256];
        let Parse::Fast(q) = wire::parse(&canon, &mut lower) else {
            return reply_bare(out, Rcode::FORMERR);
        };
        if bad_version {
            counters.record(Some(q.qtype), Rcode::BADVERS.code());
            return Outcome::Reply(write_error(&q, out, Rcode::BADVERS));
        }
        self.answer(&q, &lower[..q.qname_len], out, w)
    }

    /// Whether `lower` is a name strictly below the domain.
    #[inline]
    fn below_domain(&self, lower: &[u8]) -> bool {
        let d = self.domain.len();
        if lower.len() <= d || !lower.ends_with(&self.domain) {
            return false;
        }
        // The suffix must start on a label boundary.
        let mut pos = 0;
        while pos < lower.len() - d {
            pos += usize::from(lower[pos]) + 1;
        }
        pos == lower.len() - d
    }

    fn answer(&self, q: &Query<'_>, lower: &[u8], out: &mut [u8], w: &mut Worker<'_>) -> Outcome {
        let limit = match w.transport {
            Transport::Udp => q.udp_limit(),
            Transport::Tcp => MAX_MESSAGE,
        };
        let is_apex = lower == &self.domain[..];
        if q.qclass != 1 && q.qclass != 255 {
            if is_apex || self.below_domain(lower) {
                w.counters.record(Some(q.qtype), Rcode::REFUSED.code());
                return Outcome::Reply(write_error(q, out, Rcode::REFUSED));
            }
            return Outcome::Forward { qtype: q.qtype };
        }
        let rng = &mut w.state.rng;
        let found = self.tables.names.read(lower, |recs| match recs {
            Some(recs) if recs.iter().any(|r| r.serve) => Found::Reply(
                match q.qtype {
                    rtype::A => self.write_addrs(q, out, limit, recs, Family::V4, rng),
                    rtype::AAAA => self.write_addrs(q, out, limit, recs, Family::V6, rng),
                    _ => None,
                }
                .unwrap_or_else(|| self.write_negative(q, out, Rcode::NOERROR)),
            ),
            // Unknown, or only tombstoned or hidden records: no such name.
            _ => Found::Absent,
        });
        let found = match found {
            Found::Absent
                if lower.first().is_some_and(|&l| l > 0) && lower.get(1) == Some(&b'_') =>
            {
                match self.answer_service(q, lower, out, limit, w.state) {
                    Some(len) => Found::Reply(len),
                    None => Found::Absent,
                }
            }
            Found::Absent if lower.ends_with(&self.addr_suffix) => {
                match self.answer_target(q, lower, out) {
                    Some(len) => Found::Reply(len),
                    None => Found::Absent,
                }
            }
            Found::Absent if q.qtype == rtype::PTR => match parse_reverse(lower) {
                Some(ip) => self.tables.read_addr(ip, |refs| {
                    match refs.and_then(|refs| self.write_ptr(q, out, limit, refs)) {
                        Some(len) => Found::Reply(len),
                        None => Found::Forward,
                    }
                }),
                None => Found::Absent,
            },
            other => other,
        };
        let (len, rc) = match found {
            Found::Reply(len) => (len, Rcode::of(out).unwrap_or(Rcode::NOERROR)),
            Found::Forward => return Outcome::Forward { qtype: q.qtype },
            Found::Absent if is_apex => {
                if q.qtype == rtype::SOA {
                    (self.write_apex_soa(q, out), Rcode::NOERROR)
                } else {
                    (self.write_negative(q, out, Rcode::NOERROR), Rcode::NOERROR)
                }
            }
            // An empty non-terminal (a name below it is answered): NODATA (RFC 8020).
            Found::Absent if self.below_domain(lower) => {
                let rc = if self.tables.has_descendants(lower) {
                    Rcode::NOERROR
                } else {
                    Rcode::NXDOMAIN
                };
                (self.write_negative(q, out, rc), rc)
            }
            Found::Absent => return Outcome::Forward { qtype: q.qtype },
        };
        w.counters.record(Some(q.qtype), rc.code());
        Outcome::Reply(len)
    }

    /// Question, then the servable addresses of one family, shuffled, as many as fit
    /// (a random subset when not all do, with TC). `None` when the name has no address
    /// of that family.
    #[inline]
    fn write_addrs(
        &self,
        q: &Query<'_>,
        out: &mut [u8],
        limit: usize,
        recs: &[Rec],
        family: Family,
        rng: &mut FastRng,
    ) -> Option<usize> {
        let start = write_question(q, out);
        let rr_len = match family {
            Family::V4 => A_RR_LEN,
            Family::V6 => AAAA_RR_LEN,
        };
        // Never write past the buffer, whatever the number of records.
        let end = out.len() - OPT_LEN;
        let mut pos = start;
        for r in recs
            .iter()
            .filter(|r| r.serve && Family::of(r.ip) == family)
        {
            if pos + rr_len > end {
                break;
            }
            pos = write_addr_rr(out, pos, QUESTION, self.ttl, r.ip);
        }
        let n = (pos - start) / rr_len;
        if n == 0 {
            return None;
        }
        wire::shuffle_records(&mut out[start..pos], rr_len, rng);
        let opt = if q.edns.is_some() { OPT_LEN } else { 0 };
        let fit = n.min(limit.saturating_sub(start + opt) / rr_len);
        // fit ≤ 65535 / 16.
        Some(finish(
            q,
            out,
            start + fit * rr_len,
            Answer::authoritative(fit < n),
            Rcode::NOERROR,
            [fit as u16, 0],
        ))
    }

    /// The answer for a name whose first label starts with `_`, when it is a service
    /// name (SRV or NODATA) or the empty non-terminal above one (NODATA); `None` when
    /// no record makes it exist.
    fn answer_service(
        &self,
        q: &Query<'_>,
        lower: &[u8],
        out: &mut [u8],
        limit: usize,
        state: &mut WorkerState,
    ) -> Option<usize> {
        let has = |r: &Rec, labels: &[u8]| {
            r.srv_serve && r.service.as_ref().is_some_and(|s| &*s.labels == labels)
        };
        if let Some((labels, base)) = split_service(lower) {
            let found = self.tables.names.read(base, |recs| {
                let recs = recs?;
                if !recs.iter().any(|r| has(r, labels)) {
                    return None;
                }
                Some(match q.qtype {
                    rtype::SRV => self.write_srv(q, out, limit, recs, labels, state),
                    _ => self.write_negative(q, out, Rcode::NOERROR),
                })
            });
            if found.is_some() {
                return found;
            }
        }
        // `_tcp.<name>`: exists (empty) when a record of `<name>` has a `_x._tcp` service.
        let first = 1 + usize::from(lower[0]);
        let (label, base) = lower.split_at(first.min(lower.len()));
        let under = |r: &Rec| {
            r.srv_serve
                && r.service.as_ref().is_some_and(|s| {
                    let l = &s.labels;
                    l.get(1 + usize::from(l[0])..) == Some(label)
                })
        };
        let exists = self
            .tables
            .names
            .read(base, |recs| recs.is_some_and(|recs| recs.iter().any(under)));
        exists.then(|| self.write_negative(q, out, Rcode::NOERROR))
    }

    /// The answer for a name ending in `addr.<domain>`: an SRV target
    /// (`<hex address>.addr.<domain>`) answers its address to A or AAAA (NODATA to
    /// other types) while some name serves that address; `addr.<domain>` itself is
    /// an empty non-terminal (NODATA). `None` for anything else below it.
    fn answer_target(&self, q: &Query<'_>, lower: &[u8], out: &mut [u8]) -> Option<usize> {
        let head = &lower[..lower.len() - self.addr_suffix.len()];
        if head.is_empty() {
            return Some(self.write_negative(q, out, Rcode::NOERROR));
        }
        let ip = parse_target(head)?;
        let served = self.tables.read_addr(ip, |refs| {
            refs.is_some_and(|refs| refs.iter().any(|p| p.serve))
        });
        if !served {
            return None;
        }
        let wanted = match ip {
            IpAddr::V4(_) => rtype::A,
            IpAddr::V6(_) => rtype::AAAA,
        };
        if q.qtype != wanted {
            return Some(self.write_negative(q, out, Rcode::NOERROR));
        }
        let start = write_question(q, out);
        let pos = write_addr_rr(out, start, QUESTION, self.ttl, ip);
        // One record after a question of at most 259 bytes fits the 512 of any query.
        Some(finish(
            q,
            out,
            pos,
            Answer::Authoritative,
            Rcode::NOERROR,
            [1, 0],
        ))
    }

    /// Writes the target name of the instance at `ip`, `<hex address>.addr.<domain>`,
    /// at `out[at..]`; returns its end.
    #[inline]
    fn write_target(&self, out: &mut [u8], at: usize, ip: IpAddr) -> usize {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut octets = [0u8; 16];
        let bytes = match ip {
            IpAddr::V4(a) => {
                octets[..4].copy_from_slice(&a.octets());
                &octets[..4]
            }
            IpAddr::V6(a) => {
                octets = a.octets();
                &octets[..]
            }
        };
        out[at] = (2 * bytes.len()) as u8;
        for (i, b) in bytes.iter().enumerate() {
            out[at + 1 + 2 * i] = HEX[usize::from(b >> 4)];
            out[at + 2 + 2 * i] = HEX[usize::from(b & 0x0f)];
        }
        let pos = at + 1 + 2 * bytes.len();
        out[pos..pos + self.addr_suffix.len()].copy_from_slice(&self.addr_suffix);
        pos + self.addr_suffix.len()
    }

    /// Whether the target name of the instance at `ip` is a valid name (at most 255
    /// bytes): not for IPv6 instances when the domain is longer than 217 bytes,
    /// which are then left out of SRV answers.
    #[inline]
    fn target_fits(&self, ip: IpAddr) -> bool {
        self.srv_rr_len(ip) - SRV_FIXED_LEN <= 255
    }

    /// Length of an SRV record for the instance at `ip` (owner a pointer, target
    /// written out).
    #[inline]
    fn srv_rr_len(&self, ip: IpAddr) -> usize {
        let hex = match ip {
            IpAddr::V4(_) => 8,
            IpAddr::V6(_) => 32,
        };
        SRV_FIXED_LEN + 1 + hex + self.addr_suffix.len()
    }

    /// Question, one SRV record per instance (the `srv_serve` records of `recs`
    /// carrying the service `labels`: one per address and port) in random order,
    /// each targeting its own `<hex address>.addr.<domain>` written out (RFC 2782:
    /// no compression), TC when not all fit; then, when they all did, each
    /// target's address record, as many as fit.
    fn write_srv(
        &self,
        q: &Query<'_>,
        out: &mut [u8],
        limit: usize,
        recs: &[Rec],
        labels: &[u8],
        state: &mut WorkerState,
    ) -> usize {
        let start = write_question(q, out);
        let opt = if q.edns.is_some() { OPT_LEN } else { 0 };
        let room = limit.min(out.len() - OPT_LEN).saturating_sub(opt);
        let order = &mut state.order;
        order.clear();
        let with_service = |r: &Rec| r.service.as_ref().is_some_and(|s| &*s.labels == labels);
        // A name's records are far fewer than 2^32 (each is an entry in memory).
        order.extend(
            (0..recs.len())
                .filter(|&i| {
                    let r = &recs[i];
                    r.srv_serve && with_service(r) && self.target_fits(r.ip)
                })
                .map(|i| (i as u32, 0)),
        );
        for i in (1..order.len()).rev() {
            order.swap(i, state.rng.below(i + 1));
        }
        let mut pos = start;
        let mut fit = 0usize;
        for (i, target) in order.iter_mut() {
            let r = &recs[*i as usize];
            if pos + self.srv_rr_len(r.ip) > room {
                break;
            }
            let Some(srv) = &r.service else { continue };
            write_rr_head(&mut out[pos..], rtype::SRV, self.ttl, 0);
            let [r0, r1] = srv.spec.priority().to_be_bytes();
            let [w0, w1] = srv.spec.weight().to_be_bytes();
            let [p0, p1] = srv.spec.port().to_be_bytes();
            // The entry's priority and weight, the port, the target.
            out[pos + 12..pos + SRV_FIXED_LEN].copy_from_slice(&[r0, r1, w0, w1, p0, p1]);
            *target = (pos + SRV_FIXED_LEN) as u32;
            let end = self.write_target(out, pos + SRV_FIXED_LEN, r.ip);
            // A name is at most 255 bytes: the rdata length fits.
            let rdlen = ((end - pos - 12) as u16).to_be_bytes();
            out[pos + 10..pos + 12].copy_from_slice(&rdlen);
            pos = end;
            fit += 1;
        }
        let n = order.len();
        let (pos, ar) = if fit == n {
            self.write_srv_additionals(out, pos, room, recs, order)
        } else {
            (pos, 0)
        };
        // fit and ar ≤ 65535 / 16.
        finish_sections(
            q,
            out,
            pos,
            Answer::authoritative(fit < n),
            Rcode::NOERROR,
            [fit as u16, 0, ar as u16],
        )
    }

    /// The additional section of an SRV answer from `pos`: the address record of
    /// each target (the `srv_addr` record of each address in `order`), A records
    /// then AAAA records, each family cut to what fits below `room` (and AAAA only
    /// when every A record did), so how many there are does not depend on the
    /// shuffle. Owned by a pointer to the target when the pointer reaches it, else
    /// by the name written out. Returns the end and the count.
    fn write_srv_additionals(
        &self,
        out: &mut [u8],
        mut pos: usize,
        room: usize,
        recs: &[Rec],
        order: &[(u32, u32)],
    ) -> (usize, usize) {
        let mut ar = 0usize;
        // A name is at most 255 bytes; this holds a target written out when the
        // pointer cannot reach it (made once: most answers never use it).
        let mut name = [0u8; 255];
        for family in [Family::V4, Family::V6] {
            let rr_len = match family {
                Family::V4 => A_RR_LEN,
                Family::V6 => AAAA_RR_LEN,
            };
            for &(i, target) in order {
                let r = &recs[i as usize];
                if !r.srv_addr || Family::of(r.ip) != family {
                    continue;
                }
                let owner = match u16::try_from(target) {
                    Ok(at) if at < 0x4000 => Owner::At(at),
                    _ => {
                        let len = self.write_target(&mut name, 0, r.ip);
                        Owner::Name(&name[..len])
                    }
                };
                let owner_len = match owner {
                    Owner::At(_) => 2,
                    Owner::Name(name) => name.len(),
                };
                if pos + rr_len - 2 + owner_len > room {
                    return (pos, ar);
                }
                pos = write_addr_rr(out, pos, owner, self.ttl, r.ip);
                ar += 1;
            }
        }
        (pos, ar)
    }

    /// Question, then the servable names of an address, as many as fit (TC if not
    /// all do). `None` when none is servable.
    fn write_ptr(
        &self,
        q: &Query<'_>,
        out: &mut [u8],
        limit: usize,
        refs: &[PtrRef],
    ) -> Option<usize> {
        let mut pos = write_question(q, out);
        let opt = if q.edns.is_some() { OPT_LEN } else { 0 };
        let room = limit.min(out.len()).saturating_sub(opt);
        let (mut an, mut any, mut tc) = (0u16, false, false);
        for p in refs.iter().filter(|p| p.serve) {
            any = true;
            let len = 12 + p.name.len();
            if pos + len > room || an == u16::MAX {
                tc = true;
                break;
            }
            // A wire name is at most 255 bytes.
            write_rr_head(&mut out[pos..], rtype::PTR, self.ttl, p.name.len() as u16);
            out[pos + 12..pos + len].copy_from_slice(&p.name);
            pos += len;
            an += 1;
        }
        if !any {
            return None;
        }
        Some(finish(
            q,
            out,
            pos,
            Answer::authoritative(tc),
            Rcode::NOERROR,
            [an, 0],
        ))
    }

    /// NXDOMAIN or NODATA: question, SOA in the authority section.
    fn write_negative(&self, q: &Query<'_>, out: &mut [u8], rc: Rcode) -> usize {
        let pos = write_question(q, out);
        out[pos..pos + self.soa.len()].copy_from_slice(&self.soa);
        finish(
            q,
            out,
            pos + self.soa.len(),
            Answer::Authoritative,
            rc,
            [0, 1],
        )
    }

    fn write_apex_soa(&self, q: &Query<'_>, out: &mut [u8]) -> usize {
        let pos = write_question(q, out);
        out[pos..pos + self.soa_answer.len()].copy_from_slice(&self.soa_answer);
        finish(
            q,
            out,
            pos + self.soa_answer.len(),
            Answer::Authoritative,
            Rcode::NOERROR,
            [1, 0],
        )
    }
}

/// Hooks for the differential fuzz target (`dwara-fuzz-checks`): the hickory-proto
/// path forced on a packet the fast parser takes, to compare both answers. Not a
/// stable API.
impl crate::QueryHandler {
    /// Whether the hand-written parser takes `packet` (the fast path).
    #[doc(hidden)]
    pub fn takes_fast_path(packet: &[u8]) -> bool {
        let mut lower = [0u8; 256];
        matches!(wire::parse(packet, &mut lower), Parse::Fast(_))
    }

    /// [`answer_udp`](crate::QueryHandler::answer_udp), but with `packet` decoded by
    /// hickory-proto whatever it looks like (the slow path).
    #[doc(hidden)]
    pub fn answer_udp_slow(&mut self, packet: &[u8]) -> Option<&[u8]> {
        if packet.len() >= HEADER_LEN && wire::is_response(packet) {
            return None;
        }
        let mut w = Worker {
            handler: &self.handler,
            counters: &self.counters,
            transport: Transport::Udp,
            state: &mut self.state,
        };
        match self.handler.slow(packet, &mut self.out, &mut w) {
            Outcome::Reply(n) => Some(&self.out[..n]),
            Outcome::Forward { .. } | Outcome::Drop => None,
        }
    }
}

/// Writes an A or AAAA record of `ip` at `out[at..]`, owned by `owner`; returns
/// its end. The one writer of address records: answers, SRV targets, additional
/// records.
#[inline]
fn write_addr_rr(out: &mut [u8], at: usize, owner: Owner<'_>, ttl: u32, ip: IpAddr) -> usize {
    let at = match owner {
        Owner::At(offset) => {
            out[at..at + 2].copy_from_slice(&(0xc000 | offset).to_be_bytes());
            at + 2
        }
        Owner::Name(name) => {
            out[at..at + name.len()].copy_from_slice(name);
            at + name.len()
        }
    };
    let (rt, rdata): (u16, &[u8]) = match &ip {
        IpAddr::V4(a) => (rtype::A, &a.octets()),
        IpAddr::V6(a) => (rtype::AAAA, &a.octets()),
    };
    let [t0, t1] = rt.to_be_bytes();
    let [l0, l1] = (rdata.len() as u16).to_be_bytes();
    let [s0, s1, s2, s3] = ttl.to_be_bytes();
    out[at..at + 10].copy_from_slice(&[t0, t1, 0, 1, s0, s1, s2, s3, l0, l1]);
    out[at + 10..at + 10 + rdata.len()].copy_from_slice(rdata);
    at + 10 + rdata.len()
}

/// The address of an SRV target's first label (lower-cased wire form, then nothing):
/// 8 hex digits for IPv4, 32 for IPv6.
fn parse_target(label: &[u8]) -> Option<IpAddr> {
    let (&len, hex) = label.split_first()?;
    if usize::from(len) != hex.len() {
        return None;
    }
    let mut v: u128 = 0;
    for &c in hex {
        let nibble = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u128::from(nibble);
    }
    match hex.len() {
        // Eight hex digits are 32 bits.
        8 => Some(IpAddr::from((v as u32).to_be_bytes())),
        32 => Some(IpAddr::from(v.to_be_bytes())),
        _ => None,
    }
}

/// Copies the question after the header; returns where the answer section starts.
#[inline]
fn write_question(q: &Query<'_>, out: &mut [u8]) -> usize {
    let question = q.question();
    let end = HEADER_LEN + question.len();
    out[HEADER_LEN..end].copy_from_slice(question);
    end
}

/// Ends an authoritative response whose sections were written up to `pos`: the OPT
/// record when the query had EDNS, then the header with one question, `[answers,
/// authority]` records and the OPT counted as additional. Returns the length.
#[inline]
fn finish(
    q: &Query<'_>,
    out: &mut [u8],
    pos: usize,
    answer: Answer,
    rc: Rcode,
    [an, ns]: [u16; 2],
) -> usize {
    finish_sections(q, out, pos, answer, rc, [an, ns, 0])
}

/// [`finish`] with `ar` additional records before the OPT.
#[inline]
fn finish_sections(
    q: &Query<'_>,
    out: &mut [u8],
    pos: usize,
    answer: Answer,
    rc: Rcode,
    [an, ns, ar]: [u16; 3],
) -> usize {
    let (pos, opt) = match q.edns {
        Some(e) => (write_opt(out, pos, 0, e.dnssec_ok), 1),
        None => (pos, 0),
    };
    write_header(out, q.packet, answer, rc, [1, an, ns, ar + opt]);
    pos
}

/// A SERVFAIL response to `packet` (question echoed when it can be), for forwarding
/// failures. `None` when the packet has no header to answer.
pub(crate) fn servfail(packet: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut lower = [0u8; 256];
    match wire::parse(packet, &mut lower) {
        Parse::Fast(q) => Some(write_error(&q, out, Rcode::SERVFAIL)),
        _ => write_bare_error(packet, out, Rcode::SERVFAIL),
    }
}

/// A REFUSED response to `packet` (question and OPT echoed when the fast parser
/// takes it, else a bare header) and the query type for metrics. `None` for what
/// gets no answer at all (no header, or a response).
pub(crate) fn refused(packet: &[u8], out: &mut [u8]) -> Option<(usize, Option<u16>)> {
    let mut lower = [0u8; 256];
    match wire::parse(packet, &mut lower) {
        Parse::Fast(q) => Some((write_error(&q, out, Rcode::REFUSED), Some(q.qtype))),
        Parse::Slow => write_bare_error(packet, out, Rcode::REFUSED).map(|n| (n, None)),
        Parse::Drop => None,
    }
}

/// An empty truncated response to `packet` (TC=1, NOERROR, its question and OPT,
/// no records): never larger than the query, and it sends a real client to TCP.
/// `None` when the fast parser does not take the packet (those get no reply).
pub(crate) fn truncated(packet: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut lower = [0u8; 256];
    match wire::parse(packet, &mut lower) {
        Parse::Fast(q) => {
            let len = write_error(&q, out, Rcode::NOERROR);
            wire::set_truncated(out);
            Some(len)
        }
        Parse::Slow | Parse::Drop => None,
    }
}

#[cfg(test)]
mod tests;
