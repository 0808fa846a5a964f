//! Daemon timestamps: RFC 3339 text (`State.StartedAt`) and event `timeNano`, both as
//! nanoseconds since the Unix epoch, so a `die` can be compared with a start time.

/// Nanoseconds since the Unix epoch (negative before 1970; Docker's zero time is
/// year 1).
pub(crate) type Nanos = i128;

/// Parses Docker's RFC 3339 timestamps (`2024-05-01T10:00:00.123456789Z`, any
/// number of fraction digits, `Z` or `±HH:MM`). `None` when it is not one.
pub(crate) fn parse_rfc3339(s: &str) -> Option<Nanos> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let t = s.get(from..to)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut nanos: i64 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, c) in frac.bytes().take(digits).enumerate() {
            if i < 9 {
                nanos = nanos * 10 + i64::from(c - b'0');
            }
        }
        for _ in digits..9 {
            nanos *= 10;
        }
        rest = frac.get(digits..)?;
    }
    let offset_s: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let ob = rest.as_bytes();
            if ob.len() != 6 || ob[3] != b':' {
                return None;
            }
            let sign = match ob[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let h: i64 = rest.get(1..3)?.parse().ok()?;
            let m: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(Nanos::from(secs) * 1_000_000_000 + Nanos::from(nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `since=` text for the event stream: `SECONDS.NANOSECONDS`.
pub(crate) fn since_param(t: Nanos) -> String {
    let secs = t.div_euclid(1_000_000_000);
    let nanos = t.rem_euclid(1_000_000_000);
    format!("{secs}.{nanos:09}")
}

/// The local clock now.
pub(crate) fn now() -> Nanos {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_docker_timestamps() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2026-12-01T08:56:11.510697296Z"),
            Some(1_796_115_371_510_697_296)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T08:56:11.5Z"),
            Some(1_796_115_371_500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T09:56:11+01:00"),
            parse_rfc3339("2026-12-01T08:56:11Z")
        );
        // Docker's zero time: far before 1970, still ordered below everything real.
        let zero = parse_rfc3339("0001-01-01T00:00:00Z").unwrap();
        assert_eq!(zero, -62_135_596_800 * 1_000_000_000);
        // More than nine fraction digits are truncated, not misread.
        assert_eq!(
            parse_rfc3339("1970-01-01T00:00:01.1234567891Z"),
            Some(1_123_456_789)
        );
    }

    #[test]
    fn rejects_what_is_not_a_timestamp() {
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-01T00:00:00",
            "2026-12-01T00:00:00.Z",
            "2026-12-01T00:00:00+0100",
            "2026-12-01T0a:00:00Z",
            "2026-12-01T00:00:00Zjunk",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn since_is_seconds_dot_nanoseconds() {
        assert_eq!(
            since_param(1_796_115_371_510_697_296),
            "1796115371.510697296"
        );
        assert_eq!(since_param(5), "0.000000005");
    }
}
