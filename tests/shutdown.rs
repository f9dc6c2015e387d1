//! The gateway's shutdown: a drain stops listening, closes idle keep-alive connections, lets
//! in-flight streams finish, then exits; an in-process gateway stops through its handle.

mod common;

use std::time::{Duration, Instant};

use common::{chat_body, client, config_yaml, pool, Behavior, Gateway, TestBackend};
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_listening_lets_in_flight_streams_finish_then_exits() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 60,
            token_delay: Duration::from_millis(50),
            ..Behavior::default()
        },
    )
    .await;
    // A grace period far longer than the stream: exiting before it means the drain ended
    // when nothing was left in flight, instead of sleeping the period out.
    let yaml = config_yaml(&pool("m", "round_robin", &[backend.url()]), "")
        .replace("grace_period: 5s", "grace_period: 60s");
    let mut gw = Gateway::start_process(&yaml);
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body(100, true))
        .send()
        .await
        .unwrap();
    let mut s = r.bytes_stream();
    s.next().await.unwrap().unwrap();
    // A keep-alive connection waiting for its next request once its answer is out.
    let idle = tokio::task::spawn_blocking({
        let listen = gw.listen;
        let body = chat_body(100, false);
        move || idle_keepalive_connection(listen, &body)
    })
    .await
    .unwrap();
    let signalled = Instant::now();
    gw.terminate();
    let stream = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(c) = s.next().await {
            text.push_str(&String::from_utf8_lossy(&c.unwrap()));
        }
        (text, Instant::now())
    });
    // The drain closes the idle connection at once (it is not served another request), not
    // at the keep-alive timeout or the exit.
    let idle = tokio::task::spawn_blocking(move || (read_until_closed(idle), Instant::now()));
    // Listening stops at once, while the stream goes on.
    let listen = gw.listen;
    let refused = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if std::net::TcpStream::connect(listen).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    })
    .await
    .unwrap();
    assert!(refused, "the listener closed after SIGTERM");
    let (text, ended) = stream.await.unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream finished: {text}"
    );
    let (more, closed) = idle.await.unwrap();
    assert!(more.is_empty(), "nothing more was sent: {more:?}");
    assert!(
        closed < ended,
        "the idle connection was closed while the stream went on"
    );
    let status = tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(30)));
    assert!(
        status.flatten().is_some_and(|s| s.success()),
        "exited cleanly: {status:?}"
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(60),
        "exited before the grace period"
    );
}

/// An HTTP/1.1 connection to `listen` that has sent `body` as one keep-alive request and
/// read its whole answer (Content-Length framed).
fn idle_keepalive_connection(listen: std::net::SocketAddr, body: &[u8]) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(listen).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "answered: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let len: usize = text[..end]
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .expect("a Content-Length answer");
        assert!(text.starts_with("http/1.1 200"), "{text}");
        if got.len() >= end + 4 + len {
            return c;
        }
    }
}

/// What `c` reads until the peer closes it (panics after its read timeout).
fn read_until_closed(mut c: std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut got = Vec::new();
    c.read_to_end(&mut got)
        .expect("closed before the read timeout");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_gateway_shuts_down_through_its_handle() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let mut gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body(100, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.terminate();
    let stopped = tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(20)));
    assert!(stopped.is_some(), "the handle's shutdown stops the gateway");
    assert!(
        std::net::TcpStream::connect(gw.listen).is_err(),
        "nothing listens after it stopped"
    );
}
