//! `dwara serve` as a name server, driven by dig and the HTTP API.
