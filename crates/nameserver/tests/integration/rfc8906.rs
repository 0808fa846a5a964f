//! RFC 8906 §8: every test of §8.1 (plain DNS) and §8.2 (EDNS) with dig, for a
//! local name (the zone's apex SOA, and an SRV name) and for a forwarded one (a real
//! dnsmasq behind the server), plus the DO bit (RFC 3225) through a fallback that
//! drops it.

use std::net::SocketAddr;

use test_support::dig::DigAnswer;

use crate::support::{TestServer, fallback_dnsmasq};

/// One §8 test: the dig options, and what the reply must show.
struct Case {
    section: &'static str,
    args: &'static [&'static str],
    /// The query type (`None`: the case's usual type of the name).
    rtype: Option<&'static str>,
    expect: Expect,
}

#[derive(Clone, Copy, PartialEq)]
enum Expect {
    /// The name's answer, no OPT.
    Plain,
    /// An empty NOERROR answer (unknown type), no OPT.
    Empty,
    /// NOTIMP, opcode echoed, no answer.
    NotImp,
    /// The name's answer with an OPT of version 0, no options, no unknown flags;
    /// `do` when the query set it.
    Edns { dnssec_ok: bool },
    /// BADVERS with an OPT of version 0, no answer; `do` when the query set it.
    BadVers { dnssec_ok: bool },
}

const CASES: &[Case] = &[
    Case {
        section: "8.1.1",
        args: &["+noedns", "+noad", "+norec"],
        rtype: None,
        expect: Expect::Plain,
    },
    Case {
        section: "8.1.2",
        args: &["+noedns", "+noad", "+norec"],
        rtype: Some("TYPE1000"),
        expect: Expect::Empty,
    },
    Case {
        section: "8.1.3.1",
        args: &["+noedns", "+noad", "+norec", "+cd"],
        rtype: None,
        expect: Expect::Plain,
    },
    Case {
        section: "8.1.3.2",
        args: &["+noedns", "+norec", "+ad"],
        rtype: None,
        expect: Expect::Plain,
    },
    Case {
        section: "8.1.3.3",
        args: &["+noedns", "+noad", "+norec", "+zflag"],
        rtype: None,
        expect: Expect::Plain,
    },
    Case {
        section: "8.1.4",
        args: &["+noedns", "+noad", "+opcode=15", "+norec", "+header-only"],
        rtype: None,
        expect: Expect::NotImp,
    },
    Case {
        section: "8.1.5",
        args: &["+noedns", "+noad", "+norec", "+tcp"],
        rtype: None,
        expect: Expect::Plain,
    },
    Case {
        section: "8.2.1",
        args: &["+edns=0", "+noad", "+norec"],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: false },
    },
    Case {
        section: "8.2.2",
        args: &["+edns=1", "+noednsneg", "+noad", "+norec"],
        rtype: None,
        expect: Expect::BadVers { dnssec_ok: false },
    },
    Case {
        section: "8.2.3",
        args: &["+edns=0", "+noad", "+norec", "+ednsopt=100"],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: false },
    },
    Case {
        section: "8.2.4",
        args: &["+edns=0", "+noad", "+norec", "+ednsflags=0x80"],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: false },
    },
    Case {
        section: "8.2.5",
        args: &[
            "+edns=1",
            "+noednsneg",
            "+noad",
            "+norec",
            "+ednsflags=0x80",
        ],
        rtype: None,
        expect: Expect::BadVers { dnssec_ok: false },
    },
    Case {
        section: "8.2.6",
        args: &["+edns=1", "+noednsneg", "+noad", "+norec", "+ednsopt=100"],
        rtype: None,
        expect: Expect::BadVers { dnssec_ok: false },
    },
    // 8.2.7 asks DNSKEY with DO and a 512-byte buffer: an unsigned zone answers NODATA
    // that fits (no TC), with DO echoed.
    Case {
        section: "8.2.7",
        args: &[
            "+edns=0",
            "+noad",
            "+norec",
            "+dnssec",
            "+bufsize=512",
            "+ignore",
        ],
        rtype: Some("DNSKEY"),
        expect: Expect::Edns { dnssec_ok: true },
    },
    Case {
        section: "8.2.8",
        args: &["+edns=0", "+noad", "+norec", "+dnssec"],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: true },
    },
    Case {
        section: "8.2.9",
        args: &["+edns=1", "+noednsneg", "+noad", "+norec", "+dnssec"],
        rtype: None,
        expect: Expect::BadVers { dnssec_ok: true },
    },
    Case {
        section: "8.2.10",
        args: &[
            "+edns=0",
            "+noad",
            "+norec",
            "+cookie",
            "+nsid",
            "+expire",
            "+subnet=0.0.0.0/0",
        ],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: false },
    },
    // The same over TCP, with DO (the TCP path of 8.1.5 with 8.2.8 and 8.2.9).
    Case {
        section: "8.1.5+8.2.8",
        args: &["+edns=0", "+noad", "+norec", "+dnssec", "+tcp"],
        rtype: None,
        expect: Expect::Edns { dnssec_ok: true },
    },
    Case {
        section: "8.1.5+8.2.9",
        args: &[
            "+edns=1",
            "+noednsneg",
            "+noad",
            "+norec",
            "+dnssec",
            "+tcp",
        ],
        rtype: None,
        expect: Expect::BadVers { dnssec_ok: true },
    },
];

/// Checks `a`, dig's view of one case's reply; `answer` says what the name's answer
/// is (`None`: compare with `direct`, the fallback's own reply to the same query).
fn check(case: &Case, name: &str, a: &DigAnswer, local: bool, direct: Option<&DigAnswer>) {
    let what = format!("§{} {name} {:?}: {}", case.section, case.args, a.raw);
    let header_only = case.args.contains(&"+header-only");
    assert!(!a.has_flag("ad"), "AD is never set: {what}");
    assert!(!a.raw.contains("MBZ"), "no reserved bit is echoed: {what}");
    let edns = match case.expect {
        Expect::Plain | Expect::Empty | Expect::NotImp => None,
        Expect::Edns { dnssec_ok } | Expect::BadVers { dnssec_ok } => Some(dnssec_ok),
    };
    match edns {
        None => assert!(!a.edns, "no OPT without one in the query: {what}"),
        Some(dnssec_ok) => {
            assert!(a.edns, "an OPT answers an OPT: {what}");
            assert_eq!(a.edns_version, Some(0), "{what}");
            assert_eq!(
                a.edns_flags.contains(&"do".to_owned()),
                dnssec_ok,
                "DO echoed: {what}"
            );
            assert!(
                !a.edns_options.iter().any(|o| o.contains("OPT=100")),
                "an unknown option is not echoed: {what}"
            );
        }
    }
    match case.expect {
        Expect::NotImp => {
            assert_eq!(a.status, "NOTIMP", "{what}");
            assert_eq!(a.opcode, "RESERVED15", "{what}");
            assert!(a.answers.is_empty(), "{what}");
        }
        Expect::BadVers { .. } => {
            assert_eq!(a.status, "BADVERS", "{what}");
            assert!(a.answers.is_empty(), "{what}");
        }
        Expect::Plain | Expect::Empty | Expect::Edns { .. } if !header_only => match direct {
            // Forwarded: exactly what the fallback answers (bar the TTL it counts down).
            Some(d) => {
                assert_eq!(a.status, d.status, "{what}\nfallback: {}", d.raw);
                let data = |x: &DigAnswer| {
                    x.answers
                        .iter()
                        .map(|r| (r.rtype.clone(), r.data.clone()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(data(a), data(d), "{what}\nfallback: {}", d.raw);
            }
            None => {
                assert_eq!(a.status, "NOERROR", "{what}");
                assert!(a.has_flag("aa"), "{what}");
                assert!(!a.has_flag("tc"), "{what}");
                let want_answer = case.expect != Expect::Empty && case.rtype.is_none();
                assert_eq!(!a.answers.is_empty(), want_answer, "{what}");
                if !want_answer {
                    assert_eq!(a.authority.len(), 1, "NODATA carries the SOA: {what}");
                }
                assert!(local);
            }
        },
        _ => {}
    }
    if case.args.contains(&"+cd") && case.expect == Expect::Plain {
        assert!(a.has_flag("cd") || direct.is_some(), "CD is copied: {what}");
    }
}

fn run_cases(dns: SocketAddr, name: &str, rtype: &str, local: bool, direct_to: Option<SocketAddr>) {
    let dig = test_support::dig::Dig::new(dns);
    for case in CASES {
        // Other types of a reverse name are not ours (forwarded, as always).
        if rtype == "PTR" && case.rtype.is_some() {
            continue;
        }
        let t = case.rtype.unwrap_or(rtype);
        let a = dig.query_with(name, t, case.args).unwrap();
        let direct = direct_to.map(|d| {
            test_support::dig::Dig::new(d)
                .query_with(name, t, case.args)
                .unwrap()
        });
        check(case, name, &a, local, direct.as_ref());
    }
}

#[test]
fn every_section_8_case_for_local_names() {
    let s = TestServer::start(Vec::new());
    s.put("c1", "10.32.0.1", "web.weave.local");
    let (status, body) = s.http(
        "PUT",
        "/name/c2/10.32.0.2",
        Some("fqdn=api.weave.local&port=80&service=_http._tcp"),
    );
    assert_eq!(status, 204, "{body}");
    // The zone's apex SOA, as the RFC asks, and names of the zone.
    run_cases(s.dns, "weave.local", "SOA", true, None);
    run_cases(s.dns, "web.weave.local", "A", true, None);
    run_cases(s.dns, "_http._tcp.api.weave.local", "SRV", true, None);
    run_cases(s.dns, "2.0.32.10.in-addr.arpa", "PTR", true, None);
}

#[test]
fn every_section_8_case_for_forwarded_names() {
    let fallback = fallback_dnsmasq();
    let s = TestServer::start(vec![fallback.addr()]);
    run_cases(
        s.dns,
        "fallback-host.example",
        "A",
        false,
        Some(fallback.addr()),
    );
}

/// A UDP fallback that answers every query with itself as the response (no answer
/// records) and the DO bit of its OPT cleared, as a server that forgets RFC 3225.
fn do_dropping_server() -> SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, src)) = sock.recv_from(&mut buf) {
            if n < 12 + 11 {
                continue;
            }
            buf[2] |= 0x84;
            buf[3] &= 0xf0;
            // dig +nocookie without options: the OPT is the last 11 bytes.
            if buf[n - 11..n - 8] == [0, 0, 41] {
                buf[n - 4] = 0;
            }
            let _ = sock.send_to(&buf[..n], src);
        }
    });
    addr
}

#[test]
fn the_do_bit_is_echoed_even_when_the_fallback_drops_it() {
    let s = TestServer::start(vec![do_dropping_server()]);
    let a = s.dig().query_with("x.example", "A", &["+dnssec"]).unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.edns_flags.contains(&"do".to_owned()), "{}", a.raw);
    let plain = s.dig().query_with("x.example", "A", &["+edns=0"]).unwrap();
    assert!(plain.edns && plain.edns_flags.is_empty(), "{}", plain.raw);
    // A fallback that fails: the SERVFAIL echoes DO too.
    let none = TestServer::start(Vec::new());
    let f = none
        .dig()
        .query_with("x.example", "A", &["+dnssec"])
        .unwrap();
    assert_eq!(f.status, "SERVFAIL", "{}", f.raw);
    assert!(f.edns_flags.contains(&"do".to_owned()), "{}", f.raw);
}
