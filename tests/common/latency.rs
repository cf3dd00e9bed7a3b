//! A TCP proxy on loopback that delays every byte by a fixed time in each
//! direction: a link with a long round trip, as to a database in another
//! zone, for the budget's split to be tested against.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

/// A proxy to `127.0.0.1:target` adding `one_way` to each direction (the
/// round trip grows by twice that). Dropped, it stops accepting; the
/// connections it carries end with their peers.
pub struct Delayed {
    pub port: u16,
    accept: JoinHandle<()>,
}

impl Drop for Delayed {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Delayed {
    pub async fn to(target: u16, one_way: Duration) -> Delayed {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(carry(client_read, server_write, one_way));
                tokio::spawn(carry(server_read, client_write, one_way));
            }
        });
        Delayed { port, accept }
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, in
/// order.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
