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
//! per distinct port (priority 0, weight 1, target `<name>`, a compression pointer
//! into the question), then the addresses of those records in the additional
//! section, as many as fit (additional records never set TC). A service name that
//! exists answers NODATA to other types; `_tcp.<name>` above an existing
//! `_x._tcp.<name>` is an empty non-terminal (NODATA); any other `_` name below the
//! domain is NXDOMAIN.
//!
//! EDNS: a query's OPT is answered with ours (version 0, payload 4096, no options, the
//! query's DO bit copied as RFC 3225 asks, every other flag clear), BADVERS included.
//!
//! Shuffling: the whole record set is shuffled per query (Fisher–Yates with a
//! per-worker xorshift generator) and, when it does not fit, cut after the shuffle,
//! so a truncated answer is a random subset.

use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode};

use std::net::IpAddr;

use crate::metrics::Counters;
use crate::wire::{
    self, Answer, FastRng, HEADER_LEN, OPT_LEN, Parse, Query, rcode, rtype, write_bare_error,
    write_error, write_header, write_opt,
};
use dwara_records::Db;
use dwara_records::answers::{
    A_RR_LEN, AAAA_RR_LEN, PtrRef, Rec, SRV_RR_LEN, Tables, parse_reverse, split_service,
    write_rr_head,
};

/// Largest DNS message (TCP); output buffers must hold this much.
pub(crate) const MAX_MESSAGE: usize = 65_535;

/// The address family of an A (IPv4) or AAAA (IPv6) answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

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

/// The query handler: the answer table plus the zone's fixed records.
#[derive(Debug)]
pub(crate) struct Handler {
    tables: Arc<Tables>,
    ttl: u32,
    domain: Box<[u8]>,
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
            domain,
            soa,
            soa_answer,
        }
    }

    /// Handles one query. `out` must hold at least [`MAX_MESSAGE`] bytes.
    #[inline]
    pub(crate) fn handle(
        &self,
        packet: &[u8],
        out: &mut [u8],
        transport: Transport,
        rng: &mut FastRng,
        counters: &Counters,
    ) -> Outcome {
        let mut lower = [0u8; 256];
        match wire::parse(packet, &mut lower) {
            Parse::Fast(q) => self.answer(&q, &lower[..q.qname_len], out, transport, rng, counters),
            Parse::Slow => self.slow(packet, out, transport, rng, counters),
            Parse::Drop => {
                counters.dropped();
                Outcome::Drop
            }
        }
    }

    fn slow(
        &self,
        packet: &[u8],
        out: &mut [u8],
        transport: Transport,
        rng: &mut FastRng,
        counters: &Counters,
    ) -> Outcome {
        let reply_bare = |out: &mut [u8], rc: u8| match write_bare_error(packet, out, rc) {
            Some(n) => {
                counters.record(None, rc.into());
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
                return reply_bare(out, rcode::FORMERR);
            }
        };
        if msg.metadata.message_type == MessageType::Response {
            counters.dropped();
            return Outcome::Drop;
        }
        if msg.metadata.op_code != OpCode::Query {
            return reply_bare(out, rcode::NOTIMP);
        }
        let [query] = msg.queries.as_slice() else {
            return reply_bare(out, rcode::FORMERR);
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
            let dnssec_ok = if edns.flags().dnssec_ok { 0x80 } else { 0 };
            canon.extend_from_slice(&[0, 0, 41, p[0], p[1], 0, 0, dnssec_ok, 0, 0, 0]);
        }
        let mut lower = [0u8; 256];
        let Parse::Fast(q) = wire::parse(&canon, &mut lower) else {
            return reply_bare(out, rcode::FORMERR);
        };
        if bad_version {
            counters.record(Some(q.qtype), rcode::BADVERS);
            return Outcome::Reply(write_error(&q, out, rcode::BADVERS));
        }
        self.answer(&q, &lower[..q.qname_len], out, transport, rng, counters)
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

    fn answer(
        &self,
        q: &Query<'_>,
        lower: &[u8],
        out: &mut [u8],
        transport: Transport,
        rng: &mut FastRng,
        counters: &Counters,
    ) -> Outcome {
        let limit = match transport {
            Transport::Udp => q.udp_limit(),
            Transport::Tcp => MAX_MESSAGE,
        };
        let is_apex = lower == &self.domain[..];
        if q.qclass != 1 && q.qclass != 255 {
            if is_apex || self.below_domain(lower) {
                counters.record(Some(q.qtype), rcode::REFUSED.into());
                return Outcome::Reply(write_error(q, out, rcode::REFUSED.into()));
            }
            return Outcome::Forward { qtype: q.qtype };
        }
        let found = self.tables.names.read(lower, |recs| match recs {
            Some(recs) if recs.iter().any(|r| r.serve) => Found::Reply(
                match q.qtype {
                    rtype::A => self.write_addrs(q, out, limit, recs, Family::V4, rng),
                    rtype::AAAA => self.write_addrs(q, out, limit, recs, Family::V6, rng),
                    _ => None,
                }
                .unwrap_or_else(|| self.write_negative(q, out, rcode::NOERROR)),
            ),
            // Unknown, or only tombstoned or hidden records: no such name.
            _ => Found::Absent,
        });
        let found = match found {
            Found::Absent
                if lower.first().is_some_and(|&l| l > 0) && lower.get(1) == Some(&b'_') =>
            {
                match self.answer_service(q, lower, out, limit, rng) {
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
            Found::Reply(len) => (len, out[3] & 0x0f),
            Found::Forward => return Outcome::Forward { qtype: q.qtype },
            Found::Absent if is_apex => {
                if q.qtype == rtype::SOA {
                    (self.write_apex_soa(q, out), rcode::NOERROR)
                } else {
                    (self.write_negative(q, out, rcode::NOERROR), rcode::NOERROR)
                }
            }
            Found::Absent if self.below_domain(lower) => (
                self.write_negative(q, out, rcode::NXDOMAIN),
                rcode::NXDOMAIN,
            ),
            Found::Absent => return Outcome::Forward { qtype: q.qtype },
        };
        counters.record(Some(q.qtype), rc.into());
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
        let cap = (out.len() - start - OPT_LEN) / rr_len;
        let mut n = 0;
        for r in recs.iter().filter(|r| r.serve) {
            if n == cap {
                break;
            }
            let at = start + n * rr_len;
            match (r.ip, family) {
                (IpAddr::V4(a), Family::V4) => {
                    write_rr_head(&mut out[at..], rtype::A, self.ttl, 4);
                    out[at + 12..at + 16].copy_from_slice(&a.octets());
                }
                (IpAddr::V6(a), Family::V6) => {
                    write_rr_head(&mut out[at..], rtype::AAAA, self.ttl, 16);
                    out[at + 12..at + 28].copy_from_slice(&a.octets());
                }
                _ => continue,
            }
            n += 1;
        }
        if n == 0 {
            return None;
        }
        wire::shuffle_records(&mut out[start..start + n * rr_len], rr_len, rng);
        let opt = if q.edns.is_some() { OPT_LEN } else { 0 };
        let fit = n.min(limit.saturating_sub(start + opt) / rr_len);
        // fit ≤ 65535 / 16.
        Some(finish(
            q,
            out,
            start + fit * rr_len,
            Answer::authoritative(fit < n),
            rcode::NOERROR,
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
        rng: &mut FastRng,
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
                    rtype::SRV => self.write_srv(q, out, limit, recs, labels, rng),
                    _ => self.write_negative(q, out, rcode::NOERROR),
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
        exists.then(|| self.write_negative(q, out, rcode::NOERROR))
    }

    /// Question, one SRV record per distinct port of the records of `recs` carrying
    /// the service `labels` (shuffled; TC when not all fit), then their addresses as
    /// additional records, as many as fit.
    fn write_srv(
        &self,
        q: &Query<'_>,
        out: &mut [u8],
        limit: usize,
        recs: &[Rec],
        labels: &[u8],
        rng: &mut FastRng,
    ) -> usize {
        let start = write_question(q, out);
        // The target, `<name>`, is the question's name after the two service labels;
        // the question starts at 12 and is at most 255 bytes, so the pointer fits.
        let target = (0xc000 | (HEADER_LEN + labels.len())) as u16;
        let [t0, t1] = target.to_be_bytes();
        let opt = if q.edns.is_some() { OPT_LEN } else { 0 };
        let end = out.len() - OPT_LEN;
        let mut pos = start;
        let mut n = 0usize;
        let with_service = |r: &&Rec| r.service.as_ref().is_some_and(|s| &*s.labels == labels);
        for r in recs.iter().filter(|r| r.srv_serve).filter(with_service) {
            let Some(srv) = &r.service else { continue };
            let port = srv.spec.port().to_be_bytes();
            let seen = out[start..pos]
                .chunks_exact(SRV_RR_LEN)
                .any(|rr| rr[16..18] == port);
            if seen {
                continue;
            }
            if pos + SRV_RR_LEN > end {
                break;
            }
            write_rr_head(&mut out[pos..], rtype::SRV, self.ttl, 8);
            // Priority 0, weight 1, the port, the target.
            out[pos + 12..pos + SRV_RR_LEN]
                .copy_from_slice(&[0, 0, 0, 1, port[0], port[1], t0, t1]);
            pos += SRV_RR_LEN;
            n += 1;
        }
        wire::shuffle_records(&mut out[start..pos], SRV_RR_LEN, rng);
        let fit = n.min(limit.saturating_sub(start + opt) / SRV_RR_LEN);
        let mut pos = start + fit * SRV_RR_LEN;
        let mut ar = 0usize;
        if fit == n {
            // Additional records: every address of the records with the service, A
            // then AAAA, each block shuffled, cut to what fits.
            let room = limit.min(end).saturating_sub(opt);
            for family in [Family::V4, Family::V6] {
                let (rr_len, rt) = match family {
                    Family::V4 => (A_RR_LEN, rtype::A),
                    Family::V6 => (AAAA_RR_LEN, rtype::AAAA),
                };
                let block = pos;
                let mut count = 0usize;
                for r in recs.iter().filter(|r| r.srv_addr).filter(with_service) {
                    if pos + rr_len > end {
                        break;
                    }
                    match (r.ip, family) {
                        (IpAddr::V4(a), Family::V4) => {
                            write_rr_head(&mut out[pos..], rt, self.ttl, 4);
                            out[pos + 12..pos + 16].copy_from_slice(&a.octets());
                        }
                        (IpAddr::V6(a), Family::V6) => {
                            write_rr_head(&mut out[pos..], rt, self.ttl, 16);
                            out[pos + 12..pos + 28].copy_from_slice(&a.octets());
                        }
                        _ => continue,
                    }
                    out[pos] = t0;
                    out[pos + 1] = t1;
                    pos += rr_len;
                    count += 1;
                }
                wire::shuffle_records(&mut out[block..pos], rr_len, rng);
                let fits = count.min(room.saturating_sub(block) / rr_len);
                pos = block + fits * rr_len;
                ar += fits;
                if fits < count {
                    break;
                }
            }
        }
        // fit and ar ≤ 65535 / 16.
        finish_sections(
            q,
            out,
            pos,
            Answer::authoritative(fit < n),
            rcode::NOERROR,
            [fit as u16, 0, ar as u16],
        )
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
            rcode::NOERROR,
            [an, 0],
        ))
    }

    /// NXDOMAIN or NODATA: question, SOA in the authority section.
    fn write_negative(&self, q: &Query<'_>, out: &mut [u8], rc: u8) -> usize {
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
            rcode::NOERROR,
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
        if packet.len() >= HEADER_LEN && packet[2] & 0x80 != 0 {
            return None;
        }
        let outcome = self.handler.slow(
            packet,
            &mut self.out,
            Transport::Udp,
            &mut self.rng,
            &self.counters,
        );
        match outcome {
            Outcome::Reply(n) => Some(&self.out[..n]),
            Outcome::Forward { .. } | Outcome::Drop => None,
        }
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
    rc: u8,
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
    rc: u8,
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
        Parse::Fast(q) => Some(write_error(&q, out, rcode::SERVFAIL.into())),
        _ => write_bare_error(packet, out, rcode::SERVFAIL),
    }
}

/// A REFUSED response to `packet` (question and OPT echoed when the fast parser
/// takes it, else a bare header) and the query type for metrics. `None` for what
/// gets no answer at all (no header, or a response).
pub(crate) fn refused(packet: &[u8], out: &mut [u8]) -> Option<(usize, Option<u16>)> {
    let mut lower = [0u8; 256];
    match wire::parse(packet, &mut lower) {
        Parse::Fast(q) => Some((write_error(&q, out, rcode::REFUSED.into()), Some(q.qtype))),
        Parse::Slow => write_bare_error(packet, out, rcode::REFUSED).map(|n| (n, None)),
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
            let len = write_error(&q, out, rcode::NOERROR.into());
            out[2] |= 0x02;
            Some(len)
        }
        Parse::Slow | Parse::Drop => None,
    }
}

#[cfg(test)]
mod tests;
