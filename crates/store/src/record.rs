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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::StoreError;

/// The record version written by this build.
const RECORD_V1: u8 = 1;

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
}

impl Registration {
    /// A registration of `ip` under `fqdn` for `id`.
    pub fn new(id: impl Into<String>, ip: IpAddr, fqdn: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ip,
            fqdn: fqdn.into(),
        }
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
