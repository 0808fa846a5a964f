//! The encoding of one registration as a store key.
//!
//! A registration is its own key (the value is empty): one row per (id, ip, fqdn),
//! so putting a registration twice is one row and deleting it removes the row.
//! Rows of one id share a key prefix, so a delete by id is a range scan.
//!
//! Layout, version 1:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | record version (`1`) |
//! | 4 | id length `n`, big-endian |
//! | `n` | id, UTF-8 |
//! | 1 | address family: `4` or `6` |
//! | 4 or 16 | the address |
//! | rest | fqdn, UTF-8, not empty |
//!
//! The row's value holds what is not identity: empty for a registration without a
//! service (every row written before services existed), else, version 1:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | value version (`1`) |
//! | 2 | port, big-endian, not 0 |
//! | rest | service (`_http._tcp`), UTF-8, not empty |
//!
//! A registration whose owner checks it (`check=tcp`) is stored with value version
//! 2, which adds the check's kind (a registration with a check always has a port):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | value version (`2`) |
//! | 2 | port, big-endian, not 0 |
//! | 1 | check kind length `c`, 1–255 |
//! | `c` | check kind (`tcp`), UTF-8 |
//! | rest | service (`_http._tcp`), UTF-8, not empty |
//!
//! Rows without a check keep version 1, so a build before checks reads them; it
//! reports a version 2 row as undecodable and keeps it in the file.
//!
//! A registration whose service sets an SRV priority or weight other than the
//! defaults (0 and 1) is stored with value version 3, with or without a check:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | value version (`3`) |
//! | 2 | port, big-endian, not 0 |
//! | 2 | priority, big-endian |
//! | 2 | weight, big-endian |
//! | 1 | check kind length `c`, 0–255 (0: no check) |
//! | `c` | check kind (`tcp`), UTF-8 |
//! | rest | service (`_http._tcp`), UTF-8, not empty |
//!
//! Rows with the default priority and weight keep version 1 or 2 (and a version 3
//! value holding the defaults is rejected: one value per registration), so builds
//! before priorities read every row until one is set; they report a version 3 row
//! as undecodable and keep it in the file.
//!
//! Putting a registration again with another service or check overwrites the value:
//! still one row per (id, ip, fqdn).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::StoreError;

/// The record version written by this build.
const RECORD_V1: u8 = 1;
/// The value version written by this build for a registration with a service.
const VALUE_V1: u8 = 1;
/// The value version written by this build for a registration with a check.
const VALUE_V2: u8 = 2;
/// The value version written by this build for a service with a priority or weight
/// other than the defaults.
const VALUE_V3: u8 = 3;
/// The priority a value of version 1 or 2 stands for.
pub const DEFAULT_PRIORITY: u16 = 0;
/// The weight a value of version 1 or 2 stands for.
pub const DEFAULT_WEIGHT: u16 = 1;

/// The service and port a registration carries, with its SRV priority and weight
/// (the name server checks the service's form; the store keeps it as given).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Service {
    /// The service, e.g. `_http._tcp`.
    pub name: String,
    /// The port, 1–65535.
    pub port: u16,
    /// The SRV priority ([`DEFAULT_PRIORITY`] in rows written before priorities).
    pub priority: u16,
    /// The SRV weight ([`DEFAULT_WEIGHT`] in rows written before weights).
    pub weight: u16,
}

impl Service {
    /// `name` on `port` with the default priority and weight.
    pub fn new(name: impl Into<String>, port: u16) -> Self {
        Self {
            name: name.into(),
            port,
            priority: DEFAULT_PRIORITY,
            weight: DEFAULT_WEIGHT,
        }
    }

    /// Whether priority and weight are the defaults (stored as version 1 or 2).
    fn has_default_rank(&self) -> bool {
        self.priority == DEFAULT_PRIORITY && self.weight == DEFAULT_WEIGHT
    }
}

/// One registration: container `id` registered `ip` under `fqdn`.
///
/// The store keeps strings as given; callers store the fqdn in one canonical form
/// (the name server's: lower-case, with the trailing dot) so that deletes narrowed to
/// an fqdn match it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Registration {
    /// Who registered it (a container id).
    pub id: String,
    /// The address.
    pub ip: IpAddr,
    /// The name.
    pub fqdn: String,
    /// The service answered as SRV, if any (kept in the row's value).
    pub service: Option<Service>,
    /// How the owner checks the entry (`tcp`), if it does (kept in the row's value;
    /// needs a service, whose port the check connects to).
    pub check: Option<String>,
}

impl Registration {
    /// A registration of `ip` under `fqdn` for `id`.
    pub fn new(id: impl Into<String>, ip: IpAddr, fqdn: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ip,
            fqdn: fqdn.into(),
            service: None,
            check: None,
        }
    }

    /// The same registration carrying `service`.
    pub fn with_service(self, service: Option<Service>) -> Self {
        Self { service, ..self }
    }

    /// The same registration carrying `check` (the check's kind, e.g. `tcp`).
    pub fn with_check(self, check: Option<String>) -> Self {
        Self { check, ..self }
    }

    /// The value this registration is stored with: empty without a service. Fails
    /// for port 0 or an empty service name, and for a check without a service or
    /// whose kind is empty or longer than 255 bytes (which [`decode_row`] would
    /// reject).
    pub fn encode_value(&self) -> Result<Vec<u8>, StoreError> {
        let Some(s) = &self.service else {
            if self.check.is_some() {
                return Err(StoreError::Unencodable {
                    reason: "check without a service",
                });
            }
            return Ok(Vec::new());
        };
        if s.port == 0 || s.name.is_empty() {
            return Err(StoreError::Unencodable {
                reason: "service with port 0 or an empty name",
            });
        }
        let mut out = Vec::with_capacity(8 + s.name.len());
        let check_len = |check: &str| {
            u8::try_from(check.len())
                .ok()
                .filter(|l| *l > 0)
                .ok_or(StoreError::Unencodable {
                    reason: "check kind empty or longer than 255 bytes",
                })
        };
        match &self.check {
            _ if !s.has_default_rank() => {
                let len = self.check.as_deref().map(check_len).transpose()?;
                out.push(VALUE_V3);
                out.extend_from_slice(&s.port.to_be_bytes());
                out.extend_from_slice(&s.priority.to_be_bytes());
                out.extend_from_slice(&s.weight.to_be_bytes());
                out.push(len.unwrap_or(0));
                out.extend_from_slice(self.check.as_deref().unwrap_or_default().as_bytes());
            }
            None => {
                out.push(VALUE_V1);
                out.extend_from_slice(&s.port.to_be_bytes());
            }
            Some(check) => {
                let len = check_len(check)?;
                out.push(VALUE_V2);
                out.extend_from_slice(&s.port.to_be_bytes());
                out.push(len);
                out.extend_from_slice(check.as_bytes());
            }
        }
        out.extend_from_slice(s.name.as_bytes());
        Ok(out)
    }

    /// The key this registration is stored under. Fails for an id longer than 4 GiB
    /// or an empty fqdn (which [`decode`] would reject).
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        if self.fqdn.is_empty() {
            return Err(StoreError::Unencodable {
                reason: "empty fqdn",
            });
        }
        let mut out = id_prefix(&self.id)?;
        match self.ip {
            IpAddr::V4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
        out.extend_from_slice(self.fqdn.as_bytes());
        Ok(out)
    }
}

/// The key prefix shared by every registration of `id`.
pub(crate) fn id_prefix(id: &str) -> Result<Vec<u8>, StoreError> {
    let len = u32::try_from(id.len()).map_err(|_| StoreError::Unencodable {
        reason: "id longer than 4 GiB",
    })?;
    let mut out = Vec::with_capacity(1 + 4 + id.len() + 17 + 32);
    out.push(RECORD_V1);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(id.as_bytes());
    Ok(out)
}

fn bad(reason: &'static str) -> StoreError {
    StoreError::BadRecord { reason }
}

/// Decodes a stored key back into its registration.
///
/// Never panics: any byte string gives either the registration or
/// [`StoreError::BadRecord`] saying what is wrong with it.
///
/// ```
/// use dwara_store::{Registration, decode};
///
/// let r = Registration::new("c1", "10.32.0.7".parse().unwrap(), "web.weave.local.");
/// assert_eq!(decode(&r.encode().unwrap()).unwrap(), r);
/// assert!(decode(b"garbage").is_err());
/// ```
pub fn decode(key: &[u8]) -> Result<Registration, StoreError> {
    let (&version, rest) = key.split_first().ok_or(bad("empty record"))?;
    if version != RECORD_V1 {
        return Err(bad("unknown record version"));
    }
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or(bad("truncated id length"))?;
    let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|_| bad("id too long"))?;
    if rest.len() < len {
        return Err(bad("truncated id"));
    }
    let (id, rest) = rest.split_at(len);
    let id = std::str::from_utf8(id).map_err(|_| bad("id is not UTF-8"))?;
    let (&family, rest) = rest.split_first().ok_or(bad("missing address"))?;
    let (ip, rest) = match family {
        4 => {
            let (a, rest) = rest
                .split_first_chunk::<4>()
                .ok_or(bad("truncated IPv4 address"))?;
            (IpAddr::V4(Ipv4Addr::from(*a)), rest)
        }
        6 => {
            let (a, rest) = rest
                .split_first_chunk::<16>()
                .ok_or(bad("truncated IPv6 address"))?;
            (IpAddr::V6(Ipv6Addr::from(*a)), rest)
        }
        _ => return Err(bad("unknown address family")),
    };
    if rest.is_empty() {
        return Err(bad("empty fqdn"));
    }
    let fqdn = std::str::from_utf8(rest).map_err(|_| bad("fqdn is not UTF-8"))?;
    Ok(Registration::new(id, ip, fqdn))
}

/// Decodes a stored row, key and value, back into its registration.
///
/// Never panics: any bytes give either the registration or
/// [`StoreError::BadRecord`]. An empty value (every row of builds before services)
/// is a registration without a service; a version 1 value one without a check;
/// versions 1 and 2 have the default priority and weight.
///
/// ```
/// use dwara_store::{Registration, Service, decode_row};
///
/// let r = Registration::new("c1", "10.32.0.7".parse().unwrap(), "web.weave.local.")
///     .with_service(Some(Service::new("_http._tcp", 80)));
/// let (key, value) = (r.encode().unwrap(), r.encode_value().unwrap());
/// assert_eq!(decode_row(&key, &value).unwrap(), r);
/// assert_eq!(decode_row(&key, b"").unwrap().service, None);
/// assert!(decode_row(&key, &[9]).is_err());
/// ```
pub fn decode_row(key: &[u8], value: &[u8]) -> Result<Registration, StoreError> {
    let r = decode(key)?;
    let Some((&version, rest)) = value.split_first() else {
        return Ok(r);
    };
    if !matches!(version, VALUE_V1 | VALUE_V2 | VALUE_V3) {
        return Err(bad("unknown value version"));
    }
    let (port, rest) = rest.split_first_chunk::<2>().ok_or(bad("truncated port"))?;
    let port = u16::from_be_bytes(*port);
    if port == 0 {
        return Err(bad("port 0"));
    }
    let (priority, weight, rest) = if version == VALUE_V3 {
        let (rank, rest) = rest
            .split_first_chunk::<4>()
            .ok_or(bad("truncated priority and weight"))?;
        let priority = u16::from_be_bytes([rank[0], rank[1]]);
        let weight = u16::from_be_bytes([rank[2], rank[3]]);
        if priority == DEFAULT_PRIORITY && weight == DEFAULT_WEIGHT {
            return Err(bad("version 3 value with the default priority and weight"));
        }
        (priority, weight, rest)
    } else {
        (DEFAULT_PRIORITY, DEFAULT_WEIGHT, rest)
    };
    let (check, name) = match version {
        VALUE_V1 => (None, rest),
        _ => decode_check(rest, version == VALUE_V3)?,
    };
    if name.is_empty() {
        return Err(bad("empty service"));
    }
    let name = std::str::from_utf8(name).map_err(|_| bad("service is not UTF-8"))?;
    Ok(r.with_service(Some(Service {
        name: name.to_owned(),
        port,
        priority,
        weight,
    }))
    .with_check(check))
}

/// A value's check (length, kind) and what follows it; a length of 0 is no check
/// when `optional` (version 3), else an error (version 2 always has one).
fn decode_check(rest: &[u8], optional: bool) -> Result<(Option<String>, &[u8]), StoreError> {
    let (&len, rest) = rest.split_first().ok_or(bad("missing check length"))?;
    if len == 0 {
        return if optional {
            Ok((None, rest))
        } else {
            Err(bad("empty check"))
        };
    }
    if rest.len() < usize::from(len) {
        return Err(bad("truncated check"));
    }
    let (check, name) = rest.split_at(usize::from(len));
    let check = std::str::from_utf8(check).map_err(|_| bad("check is not UTF-8"))?;
    Ok((Some(check.to_owned()), name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u8; 16]>().prop_map(IpAddr::from),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(id in ".*", ip in ip(), fqdn in ".+") {
            let r = Registration::new(id, ip, fqdn);
            let key = r.encode().unwrap();
            prop_assert_eq!(decode(&key).unwrap(), r);
        }

        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = decode(&bytes) {
                // What decodes encodes back to the same bytes: the encoding is canonical.
                prop_assert_eq!(r.encode().unwrap(), bytes);
            }
        }

        #[test]
        fn keys_of_one_id_share_its_prefix(id in ".*", other in ".*", ip in ip(), fqdn in ".+") {
            let key = Registration::new(id.clone(), ip, fqdn).encode().unwrap();
            prop_assert!(key.starts_with(&id_prefix(&id).unwrap()));
            if other != id {
                prop_assert!(!key.starts_with(&id_prefix(&other).unwrap()));
            }
        }
    }

    #[test]
    fn values_carry_the_service() {
        let r = Registration::new("c1", "10.0.0.1".parse().unwrap(), "a.weave.local.");
        let key = r.encode().unwrap();
        assert_eq!(r.encode_value().unwrap(), b"");
        let s = r
            .clone()
            .with_service(Some(Service::new("_http._tcp", 8080)));
        let value = s.encode_value().unwrap();
        assert_eq!(value, b"\x01\x1f\x90_http._tcp");
        assert_eq!(decode_row(&key, &value).unwrap(), s);
        assert_eq!(decode_row(&key, b"").unwrap(), r);
        let cases: &[(&[u8], &str)] = &[
            (&[5, 0, 80, b'x'], "unknown value version"),
            (&[1, 0], "truncated port"),
            (&[1, 0, 0, b'x'], "port 0"),
            (&[1, 0, 80], "empty service"),
            (&[1, 0, 80, 0xff], "service is not UTF-8"),
        ];
        for (value, want) in cases {
            match decode_row(&key, value) {
                Err(StoreError::BadRecord { reason }) => assert_eq!(reason, *want, "{value:?}"),
                other => panic!("{value:?}: {other:?}"),
            }
        }
        let checked = s.clone().with_check(Some("tcp".to_owned()));
        let value = checked.encode_value().unwrap();
        assert_eq!(value, b"\x02\x1f\x90\x03tcp_http._tcp");
        assert_eq!(decode_row(&key, &value).unwrap(), checked);
        let cases: &[(&[u8], &str)] = &[
            (&[2, 0, 80], "missing check length"),
            (&[2, 0, 80, 0, b'x'], "empty check"),
            (&[2, 0, 80, 3, b't'], "truncated check"),
            (&[2, 0, 80, 1, 0xff, b'x'], "check is not UTF-8"),
            (&[2, 0, 80, 1, b't'], "empty service"),
        ];
        for (value, want) in cases {
            match decode_row(&key, value) {
                Err(StoreError::BadRecord { reason }) => assert_eq!(reason, *want, "{value:?}"),
                other => panic!("{value:?}: {other:?}"),
            }
        }
        for bad in [
            r.clone().with_check(Some("tcp".to_owned())),
            s.clone().with_check(Some(String::new())),
            s.clone().with_check(Some("x".repeat(256))),
        ] {
            assert!(bad.encode_value().is_err(), "{bad:?}");
        }
        let zero = r.with_service(Some(Service::new("_x._tcp", 0)));
        assert!(zero.encode_value().is_err());
    }

    #[test]
    fn values_carry_priority_and_weight_from_version_3() {
        let r = Registration::new("c1", "10.0.0.1".parse().unwrap(), "a.weave.local.");
        let key = r.encode().unwrap();
        let plain = r
            .clone()
            .with_service(Some(Service::new("_http._tcp", 8080)));
        // The defaults keep the older versions, which builds before weights read.
        assert_eq!(plain.encode_value().unwrap()[0], VALUE_V1);
        let ranked = r.clone().with_service(Some(Service {
            priority: 2,
            weight: 9,
            ..Service::new("_http._tcp", 8080)
        }));
        let value = ranked.encode_value().unwrap();
        assert_eq!(value, b"\x03\x1f\x90\x00\x02\x00\x09\x00_http._tcp");
        assert_eq!(decode_row(&key, &value).unwrap(), ranked);
        let checked = ranked.clone().with_check(Some("tcp".to_owned()));
        let value = checked.encode_value().unwrap();
        assert_eq!(value, b"\x03\x1f\x90\x00\x02\x00\x09\x03tcp_http._tcp");
        assert_eq!(decode_row(&key, &value).unwrap(), checked);
        // Weight 0 is a weight (RFC 2782).
        let zero = r.clone().with_service(Some(Service {
            weight: 0,
            ..Service::new("_http._tcp", 80)
        }));
        let value = zero.encode_value().unwrap();
        assert_eq!(decode_row(&key, &value).unwrap(), zero);
        let cases: &[(&[u8], &str)] = &[
            (&[3, 0, 80, 0, 1], "truncated priority and weight"),
            (
                &[3, 0, 80, 0, 0, 0, 1, 0, b'x'],
                "version 3 value with the default priority and weight",
            ),
            (&[3, 0, 80, 0, 0, 0, 2], "missing check length"),
            (&[3, 0, 80, 0, 0, 0, 2, 3, b't'], "truncated check"),
            (&[3, 0, 80, 0, 0, 0, 2, 1, 0xff, b'x'], "check is not UTF-8"),
            (&[3, 0, 80, 0, 0, 0, 2, 0], "empty service"),
            (&[4, 0, 80, b'x'], "unknown value version"),
        ];
        for (value, want) in cases {
            match decode_row(&key, value) {
                Err(StoreError::BadRecord { reason }) => assert_eq!(reason, *want, "{value:?}"),
                other => panic!("{value:?}: {other:?}"),
            }
        }
        assert!(
            ranked
                .with_check(Some(String::new()))
                .encode_value()
                .is_err()
        );
    }

    #[test]
    fn bad_records_say_what_is_wrong() {
        let good = Registration::new("c1", "10.0.0.1".parse().unwrap(), "a.weave.local.")
            .encode()
            .unwrap();
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty record"),
            (&[2, 0, 0, 0, 0], "unknown record version"),
            (&[1, 0, 0], "truncated id length"),
            (&[1, 0, 0, 0, 9, b'a'], "truncated id"),
            (
                &[1, 0, 0, 0, 1, 0xff, 4, 1, 2, 3, 4, b'x'],
                "id is not UTF-8",
            ),
            (&[1, 0, 0, 0, 0], "missing address"),
            (&[1, 0, 0, 0, 0, 5], "unknown address family"),
            (&[1, 0, 0, 0, 0, 4, 1, 2], "truncated IPv4 address"),
            (&[1, 0, 0, 0, 0, 6, 1, 2], "truncated IPv6 address"),
            (&good[..good.len() - "a.weave.local.".len()], "empty fqdn"),
            (&[1, 0, 0, 0, 0, 4, 1, 2, 3, 4, 0xc3], "fqdn is not UTF-8"),
        ];
        for (bytes, want) in cases {
            match decode(bytes) {
                Err(StoreError::BadRecord { reason }) => assert_eq!(reason, *want, "{bytes:?}"),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
        assert!(
            Registration::new("c1", "10.0.0.1".parse().unwrap(), "")
                .encode()
                .is_err()
        );
    }
}
