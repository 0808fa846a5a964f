//! Domain names as the name server keeps them.
//!
//! Every name is stored lower-cased, fully qualified (trailing dot) and, for the DNS
//! fast path, also in lower-cased wire format. Lower-casing the whole wire form byte by
//! byte is safe: label length bytes are at most 63, below `b'A'`, so ASCII
//! lower-casing never touches them.

use std::fmt::Write as _;
use std::net::IpAddr;

use hickory_proto::rr::Name;

use crate::error::{Error, Result};

/// The domain a name server is authoritative for (e.g. `weave.local.`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    name: Name,
    text: String,
    wire: Vec<u8>,
}

impl Domain {
    /// Parses a domain; a trailing dot is optional, case is folded.
    ///
    /// ```
    /// let d = dwara_records::Domain::new("Weave.Local").unwrap();
    /// assert_eq!(d.as_str(), "weave.local.");
    /// ```
    pub fn new(domain: &str) -> Result<Self> {
        let name = parse_name(domain)?;
        if name.is_root() {
            return Err(Error::InvalidName {
                name: domain.to_owned(),
                reason: "the root cannot be the served domain".to_owned(),
            });
        }
        Ok(Self {
            text: name.to_ascii(),
            wire: wire_lower(&name),
            name,
        })
    }

    /// The domain as text, lower-case, with the trailing dot.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The lower-cased wire form (length-prefixed labels, final zero byte).
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }

    /// Normalises `fqdn` and checks it lies strictly below this domain.
    ///
    /// Returns the lower-case, fully qualified text form.
    pub fn normalize_member(&self, fqdn: &str) -> Result<String> {
        self.member(fqdn).map(|n| n.to_ascii())
    }

    /// Like [`Domain::normalize_member`], in lower-cased wire form.
    pub fn member_wire(&self, fqdn: &str) -> Result<Vec<u8>> {
        self.member(fqdn).map(|n| wire_lower(&n))
    }

    fn member(&self, fqdn: &str) -> Result<Name> {
        let name = parse_name(fqdn)?;
        if name.num_labels() <= self.name.num_labels() || !self.name.zone_of(&name) {
            return Err(Error::OutsideDomain {
                name: fqdn.to_owned(),
                domain: self.text.clone(),
            });
        }
        Ok(name)
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses any domain name into its lower-cased, fully qualified form.
pub fn parse_name(input: &str) -> Result<Name> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(Error::InvalidName {
            name: input.to_owned(),
            reason: "empty".to_owned(),
        });
    }
    let mut name = Name::from_ascii(trimmed).map_err(|e| Error::InvalidName {
        name: input.to_owned(),
        reason: e.to_string(),
    })?;
    name.set_fqdn(true);
    let name = name.to_lowercase();
    // Name::from_ascii checks label lengths; the 255-byte wire limit is ours to check.
    if name.len() > 255 || wire_len(&name) > 255 {
        return Err(Error::InvalidName {
            name: input.to_owned(),
            reason: "longer than 255 bytes".to_owned(),
        });
    }
    Ok(name)
}

fn wire_len(name: &Name) -> usize {
    name.iter().map(|l| l.len() + 1).sum::<usize>() + 1
}

/// The lower-cased wire form of `name`.
pub fn wire_lower(name: &Name) -> Vec<u8> {
    let mut out = Vec::with_capacity(wire_len(name));
    for label in name.iter() {
        // Labels are at most 63 bytes (checked by hickory when parsing).
        out.push(label.len() as u8);
        out.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    out.push(0);
    out
}

/// The lower-cased wire form of a text name.
#[cfg(test)]
pub(crate) fn wire_of_text(fqdn: &str) -> Option<Vec<u8>> {
    parse_name(fqdn).ok().map(|n| wire_lower(&n))
}

/// The reverse-lookup name of an address, as text
/// (`4.3.2.1.in-addr.arpa.`, `…ip6.arpa.`).
pub fn reverse_name(addr: IpAddr) -> String {
    let mut s = String::with_capacity(73);
    match addr {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let _ = write!(s, "{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0]);
        }
        IpAddr::V6(v6) => {
            for byte in v6.octets().iter().rev() {
                let _ = write!(s, "{:x}.{:x}.", byte & 0xf, byte >> 4);
            }
            s.push_str("ip6.arpa.");
        }
    }
    s
}

/// The lower-cased wire form of the reverse-lookup name of an address.
#[cfg(test)]
pub(crate) fn reverse_wire(addr: IpAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(74);
    match addr {
        IpAddr::V4(v4) => {
            for octet in v4.octets().iter().rev() {
                let label = octet.to_string();
                out.push(label.len() as u8);
                out.extend_from_slice(label.as_bytes());
            }
            out.extend_from_slice(b"\x07in-addr\x04arpa\x00");
        }
        IpAddr::V6(v6) => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            for byte in v6.octets().iter().rev() {
                out.extend_from_slice(&[
                    1,
                    HEX[usize::from(byte & 0xf)],
                    1,
                    HEX[usize::from(byte >> 4)],
                ]);
            }
            out.extend_from_slice(b"\x03ip6\x04arpa\x00");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_is_folded_and_qualified() {
        let d = Domain::new("Weave.LOCAL").unwrap();
        assert_eq!(d.as_str(), "weave.local.");
        assert_eq!(d.wire(), b"\x05weave\x05local\x00");
    }

    #[test]
    fn members_must_be_strictly_inside() {
        let d = Domain::new("weave.local.").unwrap();
        assert_eq!(
            d.normalize_member("Foo.Weave.Local").unwrap(),
            "foo.weave.local."
        );
        assert_eq!(
            d.normalize_member("a.b.weave.local.").unwrap(),
            "a.b.weave.local."
        );
        assert!(matches!(
            d.normalize_member("weave.local"),
            Err(Error::OutsideDomain { .. })
        ));
        assert!(matches!(
            d.normalize_member("foo.example.com"),
            Err(Error::OutsideDomain { .. })
        ));
        assert!(matches!(
            d.normalize_member("fooweave.local"),
            Err(Error::OutsideDomain { .. })
        ));
        assert!(matches!(
            d.normalize_member(""),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            d.normalize_member("a..weave.local"),
            Err(Error::InvalidName { .. })
        ));
        let long = format!("{}.weave.local", "x".repeat(64));
        assert!(matches!(
            d.normalize_member(&long),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn reverse_names() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(reverse_name(v4), "3.2.1.10.in-addr.arpa.");
        assert_eq!(
            reverse_wire(v4),
            wire_of_text("3.2.1.10.in-addr.arpa.").unwrap()
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let text = reverse_name(v6);
        assert!(text.starts_with("1.0.0.0.0.0.0.0."), "{text}");
        assert!(text.ends_with("8.b.d.0.1.0.0.2.ip6.arpa."), "{text}");
        assert_eq!(reverse_wire(v6), wire_of_text(&text).unwrap());
    }
}
