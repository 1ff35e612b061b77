//! One keep-alive HTTP/1 connection to a server under test.
//!
//! Built on hyper's connection API rather than a pooled client: each
//! simulated buyer owns exactly one TCP connection for the whole run, so the
//! benchmark measures request handling, never connection setup, and the
//! number of connections equals the number of concurrent buyers.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Longest a single request may take before the connection is called broken.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A bearer credential, encoded once.
#[derive(Debug, Clone)]
pub struct Bearer(HeaderValue);

impl Bearer {
    /// `Authorization: Bearer <token>`.
    pub fn new(token: &str) -> anyhow::Result<Self> {
        Ok(Self(
            HeaderValue::from_str(&format!("Bearer {token}")).context("token is not a header")?,
        ))
    }
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// `Retry-After` in seconds, where the server sent one (the HTTP-date
    /// form is not read: no server under test sends it).
    pub retry_after: Option<Duration>,
    /// Its body.
    pub body: Bytes,
}

/// An open HTTP/1 connection.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl Conn {
    /// Opens a connection to `addr` (TCP_NODELAY, as any HTTP client would).
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .context("connect timed out")?
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        // The connection task ends when the sender is dropped or the peer closes.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let host = HeaderValue::from_str(&addr.to_string()).context("address is not a header")?;
        Ok(Self { sender, host })
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        bearer: &Bearer,
        json: Option<Bytes>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let answer = self.exchange(method, path, bearer, json).await?;
        Ok((answer.status, answer.body))
    }

    /// Sends one request and reads the whole answer, with its `Retry-After`.
    pub async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        bearer: &Bearer,
        json: Option<Bytes>,
    ) -> anyhow::Result<Answer> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone())
            .header(AUTHORIZATION, bearer.0.clone());
        if json.is_some() {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let request = request.body(Full::new(json.unwrap_or_default()))?;
        let exchange = async {
            self.sender.ready().await?;
            let response = self.sender.send_request(request).await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok(Answer {
                status,
                retry_after,
                body,
            })
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result,
            Err(_) => bail!("request timed out after {REQUEST_TIMEOUT:?}"),
        }
    }

    /// `POST path` with a JSON body.
    pub async fn post(
        &mut self,
        path: &str,
        bearer: &Bearer,
        json: Bytes,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        self.send(Method::POST, path, bearer, Some(json)).await
    }
}

/// One request on a fresh connection: for setup and checks, not load.
pub async fn once(
    addr: SocketAddr,
    method: Method,
    path: &str,
    bearer: &Bearer,
    json: Option<serde_json::Value>,
) -> anyhow::Result<(StatusCode, serde_json::Value)> {
    let mut conn = Conn::connect(addr).await?;
    let body = json.map(|j| Bytes::from(j.to_string()));
    let (status, bytes) = conn.send(method, path, bearer, body).await?;
    let value = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
    };
    Ok((status, value))
}
