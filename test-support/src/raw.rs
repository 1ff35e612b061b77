//! Requests written by hand on a socket, for tests that must know when a
//! request's bytes are on the wire, or that hang up before the answer.

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::api::ACME_KEY;

/// The bytes of a reserve as tenant `acme`, asking the server to close the
/// connection after answering.
pub fn reserve(key: &str, user: &str, sku: &str) -> String {
    let body = json!({"request_key": key, "user_id": user, "sku": sku}).to_string();
    format!(
        "POST /v1/reservations HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ACME_KEY}\r\n\
         content-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Connects to `addr` and writes `request` whole.
pub async fn send(addr: &str, request: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Reads the answer until the server closes, returning its status; `None`
/// if the server closed without answering.
pub async fn status(mut stream: TcpStream) -> Option<StatusCode> {
    let mut answer = Vec::new();
    // A reset after a partial answer still leaves what was read.
    let _ = stream.read_to_end(&mut answer).await;
    let head = String::from_utf8_lossy(&answer);
    let code = head.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    Some(StatusCode::from_u16(code.parse().ok()?).unwrap())
}
