//! Just enough DNS wire format for the fast path.
//!
//! [`parse`] reads the header and the one question of an ordinary query (with at most
//! one EDNS OPT record) without allocating, lower-casing the name into a caller's
//! buffer. Anything else — compression in the question, other sections, opcodes,
//! several questions, EDNS versions — is [`Parse::Slow`] and goes through hickory-proto
//! in `handler`. The writers below build responses in a caller's buffer.

/// The largest UDP payload we answer with, whatever the client advertises.
pub(crate) const MAX_UDP_PAYLOAD: u16 = 4096;
/// The UDP payload without EDNS (RFC 1035).
pub(crate) const CLASSIC_UDP_PAYLOAD: usize = 512;
/// Length of the OPT record we append.
pub(crate) const OPT_LEN: usize = 11;
/// Length of the DNS header.
pub(crate) const HEADER_LEN: usize = 12;

/// Record and query types the server looks at.
pub(crate) mod rtype {
    pub(crate) const A: u16 = 1;
    pub(crate) const SOA: u16 = 6;
    pub(crate) const PTR: u16 = 12;
    pub(crate) const SRV: u16 = 33;
    pub(crate) const AAAA: u16 = 28;
    pub(crate) const OPT: u16 = 41;
}

/// A response code (RFC 1035 §4.1.1, extended by RFC 6891): the low four bits go in
/// the header, the rest in the OPT record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rcode(u16);

impl Rcode {
    pub(crate) const NOERROR: Self = Self(0);
    pub(crate) const FORMERR: Self = Self(1);
    pub(crate) const SERVFAIL: Self = Self(2);
    pub(crate) const NXDOMAIN: Self = Self(3);
    pub(crate) const NOTIMP: Self = Self(4);
    pub(crate) const REFUSED: Self = Self(5);
    /// Extended (EDNS) response code 16; its high bits go in the OPT record.
    pub(crate) const BADVERS: Self = Self(16);

    /// The code as a number (for metrics).
    pub(crate) const fn code(self) -> u16 {
        self.0
    }

    /// The four bits of the header.
    const fn header_bits(self) -> u8 {
        (self.0 as u8) & flags::RCODE_MASK
    }

    /// The upper eight bits, which go in the OPT record's extended-rcode field.
    const fn ext_bits(self) -> u8 {
        (self.0 >> 4) as u8
    }

    /// The (header) response code of a DNS message; `None` without a header.
    pub(crate) fn of(message: &[u8]) -> Option<Self> {
        message
            .get(3)
            .map(|b| Self(u16::from(b & flags::RCODE_MASK)))
    }
}

impl From<Rcode> for u16 {
    fn from(rc: Rcode) -> Self {
        rc.0
    }
}

/// The bits of the header's third and fourth bytes (RFC 1035 §4.1.1).
pub(crate) mod flags {
    /// Third byte: a response.
    pub(crate) const QR: u8 = 0x80;
    /// Third byte: the opcode's four bits.
    pub(crate) const OPCODE_MASK: u8 = 0x78;
    /// Third byte: authoritative answer.
    pub(crate) const AA: u8 = 0x04;
    /// Third byte: truncated.
    pub(crate) const TC: u8 = 0x02;
    /// Third byte: recursion desired.
    pub(crate) const RD: u8 = 0x01;
    /// Fourth byte: recursion available.
    pub(crate) const RA: u8 = 0x80;
    /// Fourth byte: checking disabled (DNSSEC).
    pub(crate) const CD: u8 = 0x10;
    /// Fourth byte: the response code's four bits.
    pub(crate) const RCODE_MASK: u8 = 0x0f;
    /// The OPT record's flags (third byte of its TTL): DNSSEC OK (RFC 3225).
    pub(crate) const DO: u8 = 0x80;
}

/// Whether a message (at least a header) is a response.
#[inline]
pub(crate) fn is_response(message: &[u8]) -> bool {
    message.get(2).is_some_and(|b| b & flags::QR != 0)
}

/// Sets TC in a message whose header was written.
#[inline]
pub(crate) fn set_truncated(message: &mut [u8]) {
    message[2] |= flags::TC;
}

/// The EDNS part of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edns {
    /// The requestor's UDP payload size.
    pub(crate) payload: u16,
    /// The DO bit, copied into the response's OPT (RFC 3225).
    pub(crate) dnssec_ok: bool,
}

/// An ordinary query, parsed in place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'a> {
    /// The whole packet.
    pub(crate) packet: &'a [u8],
    /// Length of the question name in wire form.
    pub(crate) qname_len: usize,
    /// The query type.
    pub(crate) qtype: u16,
    /// The query class.
    pub(crate) qclass: u16,
    /// EDNS, if the query had an OPT record.
    pub(crate) edns: Option<Edns>,
}

impl Query<'_> {
    /// The question section as received (original case), name, type and class.
    pub(crate) fn question(&self) -> &[u8] {
        &self.packet[HEADER_LEN..HEADER_LEN + self.qname_len + 4]
    }

    /// The largest UDP response this query allows.
    pub(crate) fn udp_limit(&self) -> usize {
        match self.edns {
            None => CLASSIC_UDP_PAYLOAD,
            Some(e) => usize::from(e.payload.clamp(CLASSIC_UDP_PAYLOAD as u16, MAX_UDP_PAYLOAD)),
        }
    }
}

/// What [`parse`] made of a packet.
#[derive(Debug)]
pub(crate) enum Parse<'a> {
    /// An ordinary query; its lower-cased name is in the caller's buffer.
    Fast(Query<'a>),
    /// Something the fast path does not handle; use hickory-proto.
    Slow,
    /// Not worth an answer: shorter than a header, or a response.
    Drop,
}

#[inline]
fn u16_at(p: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([p[i], p[i + 1]])
}

/// EDNS option code of client subnet (RFC 7871), whose content hickory-proto checks.
const EDNS_CLIENT_SUBNET: u16 = 8;

/// Whether OPT rdata is a list of whole options (code, length, data) that the fast
/// path may skip: a malformed list, or a client-subnet option (whose content
/// hickory-proto validates), makes the query FORMERR on the slow path, and so goes
/// there.
fn plain_options(mut rdata: &[u8]) -> bool {
    while !rdata.is_empty() {
        if rdata.len() < 4 || u16_at(rdata, 0) == EDNS_CLIENT_SUBNET {
            return false;
        }
        let Some(rest) = rdata.get(4 + usize::from(u16_at(rdata, 2))..) else {
            return false;
        };
        rdata = rest;
    }
    true
}

/// Parses an ordinary query, writing its lower-cased question name to `lower`.
#[inline]
pub(crate) fn parse<'a>(packet: &'a [u8], lower: &mut [u8; 256]) -> Parse<'a> {
    if packet.len() < HEADER_LEN || is_response(packet) {
        return Parse::Drop;
    }
    let opcode = (packet[2] & flags::OPCODE_MASK) >> 3;
    let (qd, an, ns, ar) = (
        u16_at(packet, 4),
        u16_at(packet, 6),
        u16_at(packet, 8),
        u16_at(packet, 10),
    );
    if opcode != 0 || qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return Parse::Slow;
    }
    let mut pos = HEADER_LEN;
    loop {
        let Some(&len) = packet.get(pos) else {
            return Parse::Slow;
        };
        let len = usize::from(len);
        let at = pos - HEADER_LEN;
        if len == 0 {
            lower[at] = 0;
            pos += 1;
            break;
        }
        // Compression pointers and extended label types: slow path. 63 is the
        // largest label, 255 the largest name.
        if len > 63 || at + 1 + len + 1 > 255 || pos + 1 + len > packet.len() {
            return Parse::Slow;
        }
        lower[at] = len as u8;
        for (d, s) in lower[at + 1..at + 1 + len]
            .iter_mut()
            .zip(&packet[pos + 1..pos + 1 + len])
        {
            *d = s.to_ascii_lowercase();
        }
        pos += 1 + len;
    }
    let qname_len = pos - HEADER_LEN;
    if pos + 4 > packet.len() {
        return Parse::Slow;
    }
    let qtype = u16_at(packet, pos);
    let qclass = u16_at(packet, pos + 2);
    pos += 4;
    let mut edns = None;
    if ar == 1 {
        // Root owner, type OPT, class = payload, TTL = ext-rcode/version/flags, rdata.
        if pos + OPT_LEN > packet.len()
            || packet[pos] != 0
            || u16_at(packet, pos + 1) != rtype::OPT
            || packet[pos + 6] != 0
        {
            return Parse::Slow;
        }
        let payload = u16_at(packet, pos + 3);
        // The flags (TTL bytes 3 and 4): only DO matters; unknown ones are ignored and
        // not echoed (RFC 6891 §6.1.4).
        let rdlen = usize::from(u16_at(packet, pos + 9));
        let rdata = packet.get(pos + OPT_LEN..pos + OPT_LEN + rdlen);
        if !rdata.is_some_and(plain_options) {
            return Parse::Slow;
        }
        edns = Some(Edns {
            payload,
            dnssec_ok: packet[pos + 7] & flags::DO != 0,
        });
        pos += OPT_LEN + rdlen;
    }
    if pos != packet.len() {
        return Parse::Slow;
    }
    Parse::Fast(Query {
        packet,
        qname_len,
        qtype,
        qclass,
        edns,
    })
}

/// Whether a response is authoritative (AA), and whether all of it fit (TC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Not ours: errors, forwarding failures (AA clear).
    NotAuthoritative,
    /// An answer from our own records, complete.
    Authoritative,
    /// An answer from our own records that did not all fit (TC set).
    AuthoritativeTruncated,
}

impl Answer {
    /// An authoritative answer, truncated when `truncated`.
    pub(crate) fn authoritative(truncated: bool) -> Self {
        if truncated {
            Self::AuthoritativeTruncated
        } else {
            Self::Authoritative
        }
    }

    /// The AA and TC bits of the header's third byte.
    fn flag_bits(self) -> u8 {
        match self {
            Self::NotAuthoritative => 0,
            Self::Authoritative => flags::AA,
            Self::AuthoritativeTruncated => flags::AA | flags::TC,
        }
    }
}

/// Writes a response header for `query_header` (its first 4 bytes) into `out`.
#[inline]
pub(crate) fn write_header(
    out: &mut [u8],
    query_header: &[u8],
    answer: Answer,
    rcode: Rcode,
    counts: [u16; 4],
) {
    out[0] = query_header[0];
    out[1] = query_header[1];
    // QR, the query's opcode and RD; AA and TC as the answer says.
    out[2] = flags::QR | (query_header[2] & (flags::OPCODE_MASK | flags::RD)) | answer.flag_bits();
    // RA (we forward), the query's CD, the low rcode bits.
    out[3] = flags::RA | (query_header[3] & flags::CD) | rcode.header_bits();
    for (i, c) in counts.iter().enumerate() {
        out[4 + 2 * i..6 + 2 * i].copy_from_slice(&c.to_be_bytes());
    }
}

/// Writes our OPT record at `out[pos..]` and returns the new end: version 0, no
/// options, the DO bit when the query set it.
#[inline]
pub(crate) fn write_opt(out: &mut [u8], pos: usize, ext_rcode: u8, dnssec_ok: bool) -> usize {
    let p = MAX_UDP_PAYLOAD.to_be_bytes();
    let do_bit = if dnssec_ok { flags::DO } else { 0 };
    out[pos..pos + OPT_LEN].copy_from_slice(&[0, 0, 41, p[0], p[1], ext_rcode, 0, do_bit, 0, 0, 0]);
    pos + OPT_LEN
}

/// An error response to a parsed query: header, its question, OPT if it had one.
pub(crate) fn write_error(q: &Query<'_>, out: &mut [u8], rcode: Rcode) -> usize {
    let question = q.question();
    let mut pos = HEADER_LEN;
    out[pos..pos + question.len()].copy_from_slice(question);
    pos += question.len();
    let ar = u16::from(q.edns.is_some());
    if let Some(e) = q.edns {
        pos = write_opt(out, pos, rcode.ext_bits(), e.dnssec_ok);
    }
    write_header(
        out,
        q.packet,
        Answer::NotAuthoritative,
        rcode,
        [1, 0, 0, ar],
    );
    pos
}

/// A bare error response (header only) to a packet that has at least a header.
pub(crate) fn write_bare_error(packet: &[u8], out: &mut [u8], rcode: Rcode) -> Option<usize> {
    if packet.len() < HEADER_LEN {
        return None;
    }
    write_header(out, packet, Answer::NotAuthoritative, rcode, [0, 0, 0, 0]);
    Some(HEADER_LEN)
}

/// The question of any packet whose question name is uncompressed:
/// `(offset just past the question, qtype)`.
pub(crate) fn question_span(packet: &[u8]) -> Option<(usize, u16)> {
    if packet.len() < HEADER_LEN || u16_at(packet, 4) == 0 {
        return None;
    }
    let mut pos = HEADER_LEN;
    loop {
        let len = usize::from(*packet.get(pos)?);
        if len == 0 {
            pos += 1;
            break;
        }
        if len > 63 {
            return None;
        }
        pos += 1 + len;
    }
    if pos + 4 > packet.len() {
        return None;
    }
    Some((pos + 4, u16_at(packet, pos)))
}

/// Skips a (possibly compressed) name at `pos`; returns the offset after it.
fn skip_name(packet: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        let len = *packet.get(pos)?;
        match len {
            0 => return Some(pos + 1),
            // A compression pointer ends the name.
            0xc0..=0xff => return (pos + 2 <= packet.len()).then_some(pos + 2),
            1..=63 => pos += 1 + usize::from(len),
            _ => return None,
        }
    }
}

/// The offset of the flags byte holding DO (the third byte of the TTL) of the OPT
/// record in `packet`'s additional section, if it has one. Walks every section;
/// `None` for anything malformed.
pub(crate) fn opt_flags_at(packet: &[u8]) -> Option<usize> {
    if packet.len() < HEADER_LEN {
        return None;
    }
    let counts = [4, 6, 8, 10].map(|i| usize::from(u16_at(packet, i)));
    let mut pos = HEADER_LEN;
    for _ in 0..counts[0] {
        pos = skip_name(packet, pos)? + 4;
    }
    let records = counts[1] + counts[2];
    for i in 0..records + counts[3] {
        pos = skip_name(packet, pos)?;
        if pos + 10 > packet.len() {
            return None;
        }
        if i >= records && u16_at(packet, pos) == rtype::OPT {
            return Some(pos + 6);
        }
        pos += 10 + usize::from(u16_at(packet, pos + 8));
    }
    None
}

/// Whether `packet` carries an OPT record with the DO bit set.
pub(crate) fn dnssec_ok(packet: &[u8]) -> bool {
    opt_flags_at(packet).is_some_and(|at| packet.get(at).is_some_and(|f| f & flags::DO != 0))
}

/// A small, fast, non-cryptographic generator (xorshift64*) for answer shuffling.
#[derive(Debug, Clone)]
pub(crate) struct FastRng(u64);

impl FastRng {
    /// Seeds from the operating system's randomness.
    pub(crate) fn new() -> Self {
        Self(rand::random::<u64>() | 1)
    }

    /// Seeds from `seed` (tests).
    #[cfg(test)]
    pub(crate) fn seeded(seed: u64) -> Self {
        Self(seed | 1)
    }

    #[inline]
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    #[inline]
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }
}

/// Shuffles the `rr_len`-byte records of `buf` in place (Fisher–Yates).
#[inline]
pub(crate) fn shuffle_records(buf: &mut [u8], rr_len: usize, rng: &mut FastRng) {
    let n = buf.len() / rr_len;
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        if i != j {
            let (head, tail) = buf.split_at_mut(i * rr_len);
            head[j * rr_len..(j + 1) * rr_len].swap_with_slice(&mut tail[..rr_len]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &[u8], qtype: u16) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(name);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&[0, 1]);
        p
    }

    fn query_edns(name: &[u8], qtype: u16) -> Vec<u8> {
        let mut p = query(name, qtype);
        p[11] = 1;
        p.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        p
    }

    #[test]
    fn parses_plain_and_edns_queries() {
        let mut lower = [0u8; 256];
        let p = query(b"\x03FoO\x05weave\x05local\x00", 1);
        let Parse::Fast(q) = parse(&p, &mut lower) else {
            panic!()
        };
        assert_eq!(&lower[..q.qname_len], b"\x03foo\x05weave\x05local\x00");
        assert_eq!(q.question(), &p[12..]);
        assert_eq!((q.qtype, q.qclass, q.edns), (1, 1, None));
        assert_eq!(q.udp_limit(), 512);
        let p = query_edns(b"\x03foo\x00", 28);
        let Parse::Fast(q) = parse(&p, &mut lower) else {
            panic!()
        };
        assert_eq!(
            q.edns,
            Some(Edns {
                payload: 4096,
                dnssec_ok: false
            })
        );
        assert_eq!(q.udp_limit(), 4096);
    }

    #[test]
    fn unusual_packets_go_slow_or_drop() {
        let mut lower = [0u8; 256];
        assert!(matches!(parse(&[1, 2, 3], &mut lower), Parse::Drop));
        let mut resp = query(b"\x01a\x00", 1);
        resp[2] |= 0x80;
        assert!(matches!(parse(&resp, &mut lower), Parse::Drop));
        let compressed = query(b"\x01a\xc0\x0c", 1);
        assert!(matches!(parse(&compressed, &mut lower), Parse::Slow));
        let mut trailing = query(b"\x01a\x00", 1);
        trailing.push(0);
        assert!(matches!(parse(&trailing, &mut lower), Parse::Slow));
        let truncated = &query(b"\x01a\x00", 1)[..15];
        assert!(matches!(parse(truncated, &mut lower), Parse::Slow));
        // OPT rdata: one byte (not an option), an option longer than the rdata, a
        // client subnet; a cookie option is fine.
        for (rdata, fast) in [
            (&[0u8][..], false),
            (&[0, 10, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8][..], false),
            (&[0, 8, 0, 4, 0, 1, 24, 0][..], false),
            (&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8][..], true),
        ] {
            let mut p = query_edns(b"\x01a\x00", 1);
            let rdlen = u16::try_from(rdata.len()).unwrap().to_be_bytes();
            let n = p.len();
            p[n - 2..].copy_from_slice(&rdlen);
            p.extend_from_slice(rdata);
            assert_eq!(
                matches!(parse(&p, &mut lower), Parse::Fast(_)),
                fast,
                "{rdata:?}"
            );
        }
        let long = [&[63u8][..], &[b'x'; 63]].concat().repeat(4);
        let long = query(&[&long[..], &[0]].concat(), 1);
        assert!(matches!(parse(&long, &mut lower), Parse::Slow));
    }

    #[test]
    fn any_bytes_never_panic() {
        let mut lower = [0u8; 256];
        let mut rng = FastRng::seeded(7);
        for len in 0..300 {
            for _ in 0..50 {
                let p: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                let _ = parse(&p, &mut lower);
                let _ = question_span(&p);
            }
        }
    }

    #[test]
    fn finds_the_opt_records_flags() {
        let mut p = query_edns(b"\x01a\x00", 1);
        assert!(!dnssec_ok(&p));
        let at = opt_flags_at(&p).unwrap();
        assert_eq!(at, p.len() - 4);
        p[at] = 0x80;
        assert!(dnssec_ok(&p));
        assert_eq!(opt_flags_at(&query(b"\x01a\x00", 1)), None);
        // A response: one compressed answer before the OPT.
        let mut r = query(b"\x01a\x00", 1);
        r[2] |= 0x80;
        r[7] = 1;
        r[11] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 10, 0, 0, 1]);
        r.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0x80, 0, 0, 0]);
        assert!(dnssec_ok(&r));
        for cut in 0..r.len() - 4 {
            assert!(!dnssec_ok(&r[..cut]), "{cut}");
        }
    }

    #[test]
    fn shuffle_keeps_the_records() {
        let mut rng = FastRng::seeded(42);
        let orig: Vec<u8> = (0..10u8).flat_map(|i| [i; 4]).collect();
        let mut seen_other_first = false;
        for _ in 0..20 {
            let mut buf = orig.clone();
            shuffle_records(&mut buf, 4, &mut rng);
            let mut chunks: Vec<&[u8]> = buf.chunks(4).collect();
            seen_other_first |= chunks[0] != [0; 4];
            chunks.sort();
            assert_eq!(chunks.concat(), orig);
        }
        assert!(seen_other_first);
    }
}
