//! `dwara watch --json` following dnsmasq.
