//! `protocol: http` upstreams and `Upgrade`: a real `dwara` process between a
//! WebSocket client and WebSocket servers (tokio-tungstenite on both ends), and a
//! plain HTTP backend that does not switch protocols.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, client_async};

use crate::http_upstreams::{
    Backend, common_port, dns, in_front_of_127_0_0_2, ip, lose_then_answer, metrics, next_head,
    read_response, upstream, wait_listening,
};
use crate::serve::{Serve, WAIT};

/// A WebSocket server on `ip:port`: greets each client with `welcome from IP`
/// right behind its handshake, echoes text as `IP: TEXT` and binary as it is.
/// Reports the head of each handshake it accepted and each connection that ended.
struct WsBackend {
    heads: mpsc::UnboundedReceiver<hyper::HeaderMap>,
    ended: mpsc::UnboundedReceiver<()>,
    task: JoinHandle<()>,
}

impl WsBackend {
    async fn start(ip: Ipv4Addr, port: u16) -> Self {
        let listener = TcpListener::bind((ip, port)).await.unwrap();
        let (heads_tx, heads) = mpsc::unbounded_channel();
        let (ended_tx, ended) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (heads_tx, ended_tx) = (heads_tx.clone(), ended_tx.clone());
                conns.spawn(async move {
                    // The callback's error type is tungstenite's (an HTTP response).
                    #[allow(clippy::result_large_err)]
                    let seen = |req: &Request, resp: Response| {
                        let _ = heads_tx.send(req.headers().clone());
                        Ok(resp)
                    };
                    if let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(sock, seen).await {
                        echo(&mut ws, ip).await;
                    }
                    let _ = ended_tx.send(());
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Self { heads, ended, task }
    }

    async fn head(&mut self) -> hyper::HeaderMap {
        tokio::time::timeout(WAIT, self.heads.recv())
            .await
            .expect("no handshake reached the backend")
            .unwrap()
    }

    async fn wait_ended(&mut self) {
        tokio::time::timeout(WAIT, self.ended.recv())
            .await
            .expect("the backend's connection did not end")
            .unwrap();
    }
}

impl Drop for WsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(ws: &mut WebSocketStream<TcpStream>, ip: Ipv4Addr) {
    if ws
        .send(Message::text(format!("welcome from {ip}")))
        .await
        .is_err()
    {
        return;
    }
    while let Some(Ok(msg)) = ws.next().await {
        let reply = match msg {
            Message::Text(t) => Message::text(format!("{ip}: {t}")),
            Message::Binary(b) => Message::Binary(b),
            // Pings are answered and a close is returned by tungstenite itself.
            _ => continue,
        };
        if ws.send(reply).await.is_err() {
            return;
        }
    }
}

type Client = WebSocketStream<TcpStream>;

async fn open(proxy: SocketAddr) -> Result<Client, WsError> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (ws, resp) = tokio::time::timeout(WAIT, client_async("ws://web.test/chat", stream))
        .await
        .expect("no answer to the handshake")?;
    assert_eq!(resp.status(), 101);
    assert_eq!(resp.headers()["upgrade"], "websocket");
    Ok(ws)
}

async fn next_text(ws: &mut Client) -> String {
    match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
        other => panic!("no text message: {other:?}"),
    }
}

/// The HTTP figures of upstream `web` in `GET /upstreams`.
async fn figures(serve: &Serve) -> serde_json::Value {
    serve.status().await["upstreams"][0]["http"].clone()
}

async fn wait_tunnels(serve: &Serve, want: u64) {
    let ok =
        test_support::wait_until(WAIT, || async { figures(serve).await["tunnels"] == want }).await;
    assert!(ok, "tunnels never {want}: {}", figures(serve).await);
}

#[tokio::test]
async fn a_websocket_is_tunnelled_to_an_endpoint_and_counted_on_it_until_it_closes() {
    let port = common_port(&[ip(2)]).await;
    let mut backend = WsBackend::start(ip(2), port).await;
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "").await;
    let mut ws = open(proxy).await.unwrap();

    // The handshake went out rewritten as every request is, with the upgrade kept.
    let head = backend.head().await;
    assert_eq!(head["host"], "web.test");
    assert_eq!(head["x-forwarded-for"], "127.0.0.1");
    assert_eq!(head["upgrade"], "websocket");
    assert!(head.contains_key("sec-websocket-key"), "{head:?}");

    // What the endpoint sent right behind its 101, then messages both ways, one of
    // them far larger than a socket buffer.
    assert_eq!(next_text(&mut ws).await, "welcome from 127.0.0.2");
    for i in 0..3 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("127.0.0.2: hello {i}"));
    }
    let big: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(Some(Ok(Message::Binary(b)))) => assert!(b[..] == big[..], "binary echo differs"),
        other => panic!("no binary echo: {other:?}"),
    }

    // Its bytes count as the upstream's, live.
    let status = serve.status().await;
    let bytes = &status["upstreams"][0]["connections"];
    assert!(
        bytes["bytes_to_upstream"].as_u64().unwrap() > 4 << 20,
        "{bytes}"
    );
    assert!(
        bytes["bytes_to_client"].as_u64().unwrap() > 4 << 20,
        "{bytes}"
    );

    // Counted while open: one upgrade, one tunnel, one request in flight on the
    // endpoint (what least_connections reads).
    let h = figures(&serve).await;
    assert_eq!(h["upgrades"], 1, "{h}");
    assert_eq!(h["tunnels"], 1, "{h}");
    assert_eq!(h["requests"]["1xx"], 1, "{h}");
    let status = serve.status().await;
    assert_eq!(
        status["upstreams"][0]["endpoints"][0]["in_flight"], 1,
        "{status}"
    );
    let m = metrics(&serve).await;
    assert!(m.contains("dwara_http_tunnels{upstream=\"web\"} 1"), "{m}");
    assert!(
        m.contains("dwara_http_upgrades_total{upstream=\"web\"} 1"),
        "{m}"
    );

    // The client closes: the endpoint sees its connection end, and the tunnel is
    // no longer counted anywhere.
    ws.close(None).await.unwrap();
    while let Ok(Some(Ok(_))) = tokio::time::timeout(WAIT, ws.next()).await {}
    drop(ws);
    backend.wait_ended().await;
    wait_tunnels(&serve, 0).await;
    let status = serve.status().await;
    assert_eq!(
        status["upstreams"][0]["endpoints"][0]["in_flight"], 0,
        "{status}"
    );
    assert_eq!(
        status["upstreams"][0]["http"]["client_connections"], 0,
        "{status}"
    );
}

#[tokio::test]
async fn bytes_sent_right_behind_either_side_s_head_go_through_first() {
    let port = common_port(&[ip(2)]).await;
    let _backend = WsBackend::start(ip(2), port).await;
    let (proxy, _dns, _serve) = in_front_of_127_0_0_2(port, "").await;
    // The handshake and a first message in one write, before any answer: hyper
    // reads the message with the head.
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let mut first = b"GET /chat HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade\r\n\
        Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        .to_vec();
    first.extend(masked_text_frame(b"early"));
    raw.write_all(&first).await.unwrap();
    // The 101, and whatever came right behind it (the backend's welcome, sent with
    // its own 101).
    let mut got = Vec::new();
    let end = loop {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut raw, &mut buf))
            .await
            .expect("no answer")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let rest = got[end..].to_vec();
    let mut ws = WebSocketStream::from_partially_read(raw, rest, Role::Client, None).await;
    assert_eq!(next_text(&mut ws).await, "welcome from 127.0.0.2");
    assert_eq!(next_text(&mut ws).await, "127.0.0.2: early");
}

/// A client's text frame: final, masked (RFC 6455 §5.3), shorter than 126 bytes.
fn masked_text_frame(text: &[u8]) -> Vec<u8> {
    let key = [0x37, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x81, 0x80 | u8::try_from(text.len()).unwrap()];
    frame.extend(key);
    frame.extend(text.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

#[tokio::test]
async fn a_declined_upgrade_and_h2c_stay_http_and_a_switch_nobody_asked_for_is_a_502() {
    // A plain HTTP backend: it answers the upgrade request with 200 and what it
    // received.
    let port = common_port(&[ip(2)]).await;
    let _backend = Backend::start(ip(2), port).await;
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "").await;
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    raw.write_all(
        b"GET /first HTTP/1.1\r\nHost: web.test\r\nConnection: keep-alive, Upgrade, X-Hop\r\n\
          X-Hop: 1\r\nUpgrade: websocket\r\nTE: trailers\r\n\r\n",
    )
    .await
    .unwrap();
    let first = read_response(&mut raw).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let body: serde_json::Value =
        serde_json::from_str(&first[first.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    let headers = &body["headers"];
    assert_eq!(headers["upgrade"], "websocket", "{body}");
    assert_eq!(headers["connection"], "upgrade", "{body}");
    // The other headers `Connection` named are still removed, and so is `TE`
    // (a tunnel carries no trailers).
    assert!(headers.get("x-hop").is_none(), "{body}");
    assert!(headers.get("te").is_none(), "{body}");
    assert!(
        !first.to_ascii_lowercase().contains("keep-alive: "),
        "{first}"
    );

    // The same connection goes on as HTTP/1.1.
    raw.write_all(b"GET /second HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let second = read_response(&mut raw).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(second.contains("\"uri\":\"/second\""), "{second}");

    // An h2c upgrade (`curl --http2`) is not offered: the request goes on the
    // pooled path as HTTP/1.1, without the upgrade.
    let before = figures(&serve).await["reused"].as_u64().unwrap();
    raw.write_all(
        b"GET /third HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade, HTTP2-Settings\r\n\
          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
    )
    .await
    .unwrap();
    let third = read_response(&mut raw).await;
    assert!(third.starts_with("HTTP/1.1 200"), "{third}");
    let body: serde_json::Value =
        serde_json::from_str(&third[third.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    for hop in ["upgrade", "connection", "http2-settings"] {
        assert!(body["headers"].get(hop).is_none(), "{hop}: {body}");
    }
    let h = figures(&serve).await;
    assert_eq!(h["reused"], before + 1, "{h}");

    // An endpoint that switches protocols though no upgrade was asked for: the
    // client gets a 502, not a 101 it did not ask for.
    raw.write_all(b"GET /switch HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let fourth = read_response(&mut raw).await;
    assert!(fourth.starts_with("HTTP/1.1 502"), "{fourth}");
    let h = figures(&serve).await;
    assert_eq!(h["upgrades"], 0, "{h}");
    assert_eq!(h["tunnels"], 0, "{h}");
    assert_eq!(h["requests"]["2xx"], 3, "{h}");
    assert_eq!(h["bad_gateway_502"], 1, "{h}");

    // A CONNECT gets a 501 made here and reaches no endpoint (this backend would
    // have said 200 to it, which hyper turns into a tunnel nothing carries), and
    // the connection goes on as HTTP/1.1.
    let tries =
        |h: &serde_json::Value| h["connects"].as_u64().unwrap() + h["reused"].as_u64().unwrap();
    let before = tries(&h);
    raw.write_all(b"CONNECT web.test:443 HTTP/1.1\r\nHost: web.test:443\r\n\r\n")
        .await
        .unwrap();
    let fifth = read_response(&mut raw).await;
    assert!(fifth.starts_with("HTTP/1.1 501"), "{fifth}");
    assert!(
        fifth.contains("CONNECT is not proxied by upstream web"),
        "{fifth}"
    );
    raw.write_all(b"GET /sixth HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let sixth = read_response(&mut raw).await;
    assert!(sixth.starts_with("HTTP/1.1 200"), "{sixth}");
    let h = figures(&serve).await;
    assert_eq!(
        tries(&h),
        before + 1,
        "only /sixth went to the endpoint: {h}"
    );
    assert_eq!(h["not_implemented_501"], 1, "{h}");
    assert_eq!(h["requests"]["5xx"], 2, "{h}");
    let m = metrics(&serve).await;
    assert!(
        m.contains("dwara_http_generated_total{upstream=\"web\",status=\"501\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_and_an_upgrade_with_nothing_to_route_to_gets_503() {
    let port = common_port(&[ip(2)]).await;
    let mut backend = WsBackend::start(ip(2), port).await;
    let (proxy, dns, serve) =
        in_front_of_127_0_0_2(port, "    limits: {tunnel_idle_timeout_s: 1}\n").await;
    let mut ws = open(proxy).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "welcome from 127.0.0.2");

    // Traffic keeps it open past its idle timeout...
    let busy_until = tokio::time::Instant::now() + Duration::from_millis(2500);
    let mut n = 0;
    while tokio::time::Instant::now() < busy_until {
        ws.send(Message::text(format!("tick {n}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("127.0.0.2: tick {n}"));
        n += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(figures(&serve).await["tunnels"], 1);

    // ... and a second without any closes both sides.
    match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(None | Some(Err(_))) => {}
        other => panic!("the idle tunnel was not closed: {other:?}"),
    }
    backend.wait_ended().await;
    wait_tunnels(&serve, 0).await;

    // Nothing to route to: 503, as for any request.
    dns.set_a("web.test", &[], 1);
    serve.wait_endpoints(&[]).await;
    match open(proxy).await {
        Err(WsError::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let body = resp.body().clone().unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&body),
                "no endpoints for upstream web\n"
            );
        }
        other => panic!("not a 503: {:?}", other.map(|_| "switched")),
    }
    assert_eq!(figures(&serve).await["upgrades"], 1);
}

#[tokio::test]
async fn a_tunnel_is_drained_at_shutdown_and_closed_at_the_drain_deadline() {
    let port = common_port(&[ip(2)]).await;
    let mut backend = WsBackend::start(ip(2), port).await;
    let dns = dns(&[ip(2)]).await;
    let proxy = test_support::free_addr();
    // The tests' dwara drains for at most 5 s.
    let serve = Serve::spawn(&upstream(proxy, port, dns.addr(), ""));
    serve.wait_endpoints(&[format!("127.0.0.2:{port}")]).await;
    wait_listening(proxy).await;
    let mut ws = open(proxy).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "welcome from 127.0.0.2");

    serve.signal("TERM");
    // No new connection is accepted, but the open tunnel still carries messages
    // while dwara drains...
    let stopped =
        test_support::wait_until(WAIT, || async { TcpStream::connect(proxy).await.is_err() }).await;
    assert!(stopped, "still accepting after SIGTERM");
    ws.send(Message::text("still there")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "127.0.0.2: still there");
    // ... and is closed at the drain deadline, on both sides.
    match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(None | Some(Err(_))) => {}
        other => panic!("the tunnel outlived the drain deadline: {other:?}"),
    }
    backend.wait_ended().await;
}

/// An upgrade request that went out whole and got no answer (the endpoint took it
/// and closed) is sent again, as any idempotent request is: from the copy of its
/// head kept for that, byte for byte the head the endpoint saw the first time
/// (with its `Connection: Upgrade` and `Upgrade` put back); the tunnel then opens
/// on the second try.
#[tokio::test]
async fn a_lost_upgrade_request_is_sent_again_with_the_same_head() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "    max_tries: 2\n").await;
    let endpoint = tokio::spawn(async move {
        let switch =
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
        let (first, again, conn) = lose_then_answer(&listener, switch).await;
        // The tunnel: what comes is sent back.
        let (mut rd, mut wr) = conn.into_split();
        tokio::io::copy(&mut rd, &mut wr).await.unwrap();
        (first, again)
    });

    let mut raw = TcpStream::connect(proxy).await.unwrap();
    raw.write_all(
        b"GET /tunnel HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade\r\n\
          Upgrade: echo\r\nX-Twice: one\r\nX-Twice: two\r\n\r\n",
    )
    .await
    .unwrap();
    // The answer's head, read as a request's is: up to its blank line.
    let got = next_head(&mut raw, "the answer's head").await;
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    raw.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_exact(&mut raw, &mut echoed),
    )
    .await
    .expect("nothing came back through the tunnel")
    .unwrap();
    assert_eq!(&echoed, b"ping");
    drop(raw);

    let (first, again) = tokio::time::timeout(WAIT, endpoint)
        .await
        .expect("the tunnel did not end")
        .unwrap();
    let text = String::from_utf8_lossy(&first).to_ascii_lowercase();
    assert!(text.starts_with("get /tunnel http/1.1\r\n"), "{text}");
    assert!(text.contains("\r\nupgrade: echo\r\n"), "{text}");
    assert!(
        text.find("x-twice: one").unwrap() < text.find("x-twice: two").unwrap(),
        "{text}"
    );
    assert_eq!(
        again,
        first,
        "the head sent again: {}",
        String::from_utf8_lossy(&again)
    );
    let h = figures(&serve).await;
    assert_eq!(h["retries"], 1, "{h}");
}
