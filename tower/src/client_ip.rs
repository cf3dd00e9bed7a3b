//! [`ClientIp`]: the client's address, as the deployment resolved it.

use std::net::IpAddr;

use http::request::Parts;

/// The client's address as the deployment resolved it, put in the request's extensions: what
/// [`client_ip`] and
/// [`LimitLayer::limit_per_client_ip`](super::LimitLayer::limit_per_client_ip) read first. No
/// `X-Forwarded-For`, `Forwarded` or `X-Real-IP` is read
/// ([why](crate#behind-a-tower-layer)).
///
/// # Behind a proxy
///
/// A middleware that believes the last `X-Forwarded-For` entry only from the proxies you name,
/// else the peer. With a chain of proxies, skip from the right one entry per trusted proxy
/// behind the first.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use std::sync::Arc;
///
/// use axum::extract::{ConnectInfo, Request, State};
/// use axum::middleware::{self, Next};
/// use axum::response::Response;
/// use axum::{Extension, Router, body::Body, routing::get};
/// use platformkit_limit_tower::ClientIp;
/// use tower::ServiceExt as _;
///
/// /// The proxies this service stands behind: only their header counts.
/// #[derive(Clone)]
/// struct Proxies(Arc<[IpAddr]>);
///
/// async fn client_ip_from_proxy(
///     State(Proxies(proxies)): State<Proxies>,
///     ConnectInfo(peer): ConnectInfo<SocketAddr>,
///     mut request: Request,
///     next: Next,
/// ) -> Response {
///     let forwarded = || {
///         let header = request.headers().get_all("x-forwarded-for").iter().next_back()?;
///         header.to_str().ok()?.rsplit(',').next()?.trim().parse().ok()
///     };
///     let trusted = proxies.contains(&peer.ip());
///     let address = trusted.then(forwarded).flatten().unwrap_or(peer.ip());
///     request.extensions_mut().insert(ClientIp(address));
///     next.run(request).await
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let proxy: IpAddr = "10.0.0.2".parse()?;
/// let app = Router::new()
///     .route("/", get(|Extension(ClientIp(ip)): Extension<ClientIp>| async move { ip.to_string() }))
///     // .layer(LimitLayer::...limit_per_client_ip(...)) goes here, inside:
///     .layer(middleware::from_fn_with_state(Proxies(Arc::new([proxy])), client_ip_from_proxy));
/// let from = |peer: IpAddr| {
///     Request::get("/")
///         .extension(ConnectInfo(SocketAddr::new(peer, 50_000))) // axum's, from the socket
///         .header("x-forwarded-for", "203.0.113.66, 198.51.100.7")
///         .body(Body::empty())
/// };
/// let client_ip = async |peer| -> Result<String, Box<dyn std::error::Error>> {
///     let body = app.clone().oneshot(from(peer)?).await?.into_body();
///     Ok(String::from_utf8(axum::body::to_bytes(body, 64).await?.to_vec())?)
/// };
/// assert_eq!(client_ip(proxy).await?, "198.51.100.7"); // what the proxy saw
/// assert_eq!(client_ip("192.0.2.9".parse()?).await?, "192.0.2.9"); // header ignored
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientIp(pub IpAddr);

/// The client's address: the request's [`ClientIp`] extension, else (feature `axum`) axum's
/// `ConnectInfo<SocketAddr>`; `None` when the request carries neither. For a key function of
/// your own.
pub fn client_ip(head: &Parts) -> Option<IpAddr> {
    if let Some(ClientIp(address)) = head.extensions.get::<ClientIp>() {
        return Some(*address);
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(peer)) = head
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
    {
        return Some(peer.ip());
    }
    None
}
