//! A bare HTTP/1.1 client for the example services the tests start on a
//! loopback port: one request per connection, written by hand, so the
//! tests need no HTTP client crate and see the answer's bytes as sent; and,
//! with `axum`, the server side: an app served on a loopback port.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An answer: its status, its header fields in order, and its body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The value of the field `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// `Retry-After`, in whole seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")
            .map(|value| value.parse().expect("whole seconds"))
    }
}

/// One request on its own connection: `headers` are sent as given, and a
/// non-empty `form` as an urlencoded body.
pub async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    form: &str,
) -> Answer {
    let mut stream = TcpStream::connect(address)
        .await
        .expect("the service listens");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !form.is_empty() {
        request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    ));
    stream
        .write_all(request.as_bytes())
        .await
        .expect("a request");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("an answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// `app` on a loopback port, served by hyper through `axum::serve`, with or
/// without the peer's address in `ConnectInfo`.
pub async fn serve(app: axum::Router, connect_info: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        if connect_info {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        } else {
            axum::serve(listener, app).await
        }
    });
    address
}
