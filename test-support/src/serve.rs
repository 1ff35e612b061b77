//! A service served in the test's own process on a loopback port.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The future a service's `run` waits on to start its graceful shutdown.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A service serving on loopback until [`Served::stop`].
pub struct Served {
    /// `http://` and the bound address.
    pub url: String,
    /// The bound address.
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl Served {
    /// Binds `addr` (any free loopback port if `None`) and spawns
    /// `run(listener, shutdown)`, a service's `run` with its state bound.
    pub async fn start<F>(
        addr: Option<SocketAddr>,
        run: impl FnOnce(TcpListener, Shutdown) -> F,
    ) -> Self
    where
        F: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown: Shutdown = Box::pin(async move {
            let _ = rx.await;
        });
        let server = tokio::spawn(run(listener, shutdown));
        Self {
            url: format!("http://{addr}"),
            addr,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// Graceful shutdown: returns once every in-flight request is answered
    /// and `run` has returned, asserting it returned `Ok`.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }
}
