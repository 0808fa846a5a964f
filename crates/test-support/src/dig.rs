//! dig(1) as the tests' DNS client: runs it and parses the parts tests look at.
//!
//! ```no_run
//! let dig = test_support::dig::Dig::new("127.0.0.1:1053".parse().unwrap());
//! let answer = dig.query("web.weave.local", "A").unwrap();
//! assert_eq!(answer.status, "NOERROR");
//! println!("{:?}", answer.data("A"));
//! ```

use std::io;
use std::net::SocketAddr;
use std::process::Command;

/// One resource record as dig prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigRecord {
    /// Owner name, as printed (case preserved).
    pub name: String,
    /// TTL in seconds.
    pub ttl: u32,
    /// Record type (`A`, `SOA`…).
    pub rtype: String,
    /// The data, as printed (`10.0.0.1`, `foo.weave.local.`…).
    pub data: String,
}

/// What dig received.
#[derive(Debug, Clone)]
pub struct DigAnswer {
    /// The response code (`NOERROR`, `NXDOMAIN`…).
    pub status: String,
    /// Header flags (`qr`, `aa`, `tc`…).
    pub flags: Vec<String>,
    /// The answer section.
    pub answers: Vec<DigRecord>,
    /// The authority section.
    pub authority: Vec<DigRecord>,
    /// The additional section (without the OPT pseudo-record).
    pub additional: Vec<DigRecord>,
    /// The opcode (`QUERY`, `RESERVED15`…).
    pub opcode: String,
    /// Whether the response carried an OPT record.
    pub edns: bool,
    /// The OPT record's version, when there is one.
    pub edns_version: Option<u8>,
    /// The OPT record's flags as dig names them (`do`), unknown ones as `MBZ: 0x…`.
    pub edns_flags: Vec<String>,
    /// The EDNS options dig printed (`NSID`, `COOKIE`, `OPT=100`…), one per line.
    pub edns_options: Vec<String>,
    /// dig's whole output, for assertion messages.
    pub raw: String,
}

impl DigAnswer {
    /// Whether a header flag is set.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// The data of the answer records of type `rtype`, sorted.
    pub fn data(&self, rtype: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .answers
            .iter()
            .filter(|r| r.rtype.eq_ignore_ascii_case(rtype))
            .map(|r| r.data.clone())
            .collect();
        v.sort();
        v
    }
}

/// dig against one server.
#[derive(Debug, Clone)]
pub struct Dig {
    server: SocketAddr,
}

impl Dig {
    /// Queries go to `server` (UDP unless `+tcp` is passed).
    pub fn new(server: SocketAddr) -> Self {
        Self { server }
    }

    /// `dig NAME TYPE` with one try and a 2 s timeout.
    pub fn query(&self, name: &str, rtype: &str) -> io::Result<DigAnswer> {
        self.query_with(name, rtype, &[])
    }

    /// `dig NAME TYPE EXTRA…` (e.g. `+tcp`, `+ignore`, `+bufsize=4096`, `+noedns`).
    pub fn query_with(&self, name: &str, rtype: &str, extra: &[&str]) -> io::Result<DigAnswer> {
        self.run(&[name, rtype], extra)
    }

    /// `dig -x IP` (a PTR query).
    pub fn reverse(&self, ip: &str) -> io::Result<DigAnswer> {
        self.run(&["-x", ip], &[])
    }

    fn run(&self, query: &[&str], extra: &[&str]) -> io::Result<DigAnswer> {
        let out = Command::new("dig")
            .arg(format!("@{}", self.server.ip()))
            .arg("-p")
            .arg(self.server.port().to_string())
            .args(["+tries=1", "+time=3", "+nocookie"])
            .args(query)
            .args(extra)
            .output()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run dig (apt-get install -y bind9-dnsutils): {e}"),
                )
            })?;
        let raw = String::from_utf8_lossy(&out.stdout).into_owned();
        parse(&raw).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "dig got no answer from {} ({}): {raw}",
                    self.server, out.status
                ),
            )
        })
    }
}

/// Parses dig's default output; `None` when it shows no response.
pub fn parse(raw: &str) -> Option<DigAnswer> {
    let mut status = None;
    let mut flags = Vec::new();
    let mut answers = Vec::new();
    let mut authority = Vec::new();
    let mut additional = Vec::new();
    let mut opcode = String::new();
    let mut edns = false;
    let mut edns_version = None;
    let mut edns_flags = Vec::new();
    let mut edns_options = Vec::new();
    #[derive(PartialEq)]
    enum Section {
        Other,
        Opt,
        Answer,
        Authority,
        Additional,
    }
    let mut section = Section::Other;
    for line in raw.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(";; ->>HEADER<<-") {
            status = rest
                .split(',')
                .find_map(|p| p.trim().strip_prefix("status:"))
                .map(|s| s.trim().to_owned());
            opcode = rest
                .split(',')
                .find_map(|p| p.trim().strip_prefix("opcode:"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default();
        } else if let Some(rest) = line.strip_prefix(";; flags:") {
            flags = rest
                .split(';')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
        } else if line.starts_with(";; OPT PSEUDOSECTION") {
            edns = true;
            section = Section::Opt;
        } else if let Some(rest) = line.strip_prefix("; EDNS:") {
            // `; EDNS: version: 0, flags: do; MBZ: 0x0080, udp: 4096`
            for part in rest.split([',', ';']) {
                let part = part.trim();
                if let Some(v) = part.strip_prefix("version:") {
                    edns_version = v.trim().parse().ok();
                } else if let Some(f) = part.strip_prefix("flags:") {
                    edns_flags.extend(f.split_whitespace().map(str::to_owned));
                } else if part.starts_with("MBZ:") {
                    edns_flags.push(part.to_owned());
                }
            }
        } else if section == Section::Opt && line.starts_with("; ") {
            edns_options.push(line.trim_start_matches("; ").to_owned());
        } else if line.starts_with(";; ANSWER SECTION") {
            section = Section::Answer;
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = Section::Authority;
        } else if line.starts_with(";; ADDITIONAL SECTION") {
            section = Section::Additional;
        } else if line.starts_with(';') || line.is_empty() {
            if line.starts_with(";;") {
                section = Section::Other;
            }
        } else if section != Section::Other && section != Section::Opt {
            let Some(rec) = record_line(line) else {
                continue;
            };
            match section {
                Section::Answer => answers.push(rec),
                Section::Authority => authority.push(rec),
                Section::Additional => additional.push(rec),
                Section::Other | Section::Opt => {}
            }
        }
    }
    Some(DigAnswer {
        status: status?,
        flags,
        answers,
        authority,
        additional,
        opcode,
        edns,
        edns_version,
        edns_flags,
        edns_options,
        raw: raw.to_owned(),
    })
}

/// One record line of a section: `name ttl class type data…`.
fn record_line(line: &str) -> Option<DigRecord> {
    let mut w = line.split_whitespace();
    let (name, ttl, _class, rtype) = (w.next()?, w.next()?, w.next()?, w.next()?);
    Some(DigRecord {
        name: name.to_owned(),
        ttl: ttl.parse().unwrap_or(u32::MAX),
        rtype: rtype.to_owned(),
        data: w.collect::<Vec<_>>().join(" "),
    })
}

/// The target name dwara's SRV answers give the instance at `ip` under `domain`
/// (`<hex address>.addr.<domain>.`), worked out independently of the server's code.
pub fn srv_target(ip: std::net::IpAddr, domain: &str) -> String {
    let hex: String = match ip {
        std::net::IpAddr::V4(a) => a.octets().iter().map(|b| format!("{b:02x}")).collect(),
        std::net::IpAddr::V6(a) => a.octets().iter().map(|b| format!("{b:02x}")).collect(),
    };
    format!("{hex}.addr.{}.", domain.trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_digs_output() {
        let raw = r";; ->>HEADER<<- opcode: QUERY, status: NXDOMAIN, id: 1
;; flags: qr aa rd ra; QUERY: 1, ANSWER: 1, AUTHORITY: 1, ADDITIONAL: 1

;; OPT PSEUDOSECTION:
; EDNS: version: 0, flags:; udp: 4096
;; QUESTION SECTION:
;Foo.weave.local.		IN	A

;; ANSWER SECTION:
Foo.weave.local.	1	IN	A	10.0.0.1

;; AUTHORITY SECTION:
weave.local.		1	IN	SOA	ns.weave.local. hostmaster.weave.local. 1 3600 600 86400 1

;; Query time: 0 msec
";
        let a = super::parse(raw).unwrap();
        assert_eq!(a.status, "NXDOMAIN");
        assert!(a.has_flag("aa") && !a.has_flag("tc") && a.edns);
        assert_eq!(a.data("a"), ["10.0.0.1"]);
        assert_eq!(a.answers[0].name, "Foo.weave.local.");
        assert_eq!(a.authority[0].rtype, "SOA");
        assert!(super::parse(";; communications error to 127.0.0.1#1 timed out\n").is_none());
    }
}
