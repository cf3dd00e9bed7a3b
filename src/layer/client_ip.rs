//! [`ClientIp`]: the client's address, as the deployment resolved it.

use std::net::IpAddr;

use http::request::Parts;

/// The client's address, resolved before the layer by something that knows
/// how the service is deployed, and put in the request's extensions: what
/// [`client_ip`] and
/// [`LimitLayer::limit_per_client_ip`](super::LimitLayer::limit_per_client_ip)
/// read first.
///
/// The library never reads `X-Forwarded-For` (nor `Forwarded`,
/// `X-Real-IP`): any client can write it, and which entry to believe is a
/// fact of the deployment (how many proxies, which addresses). A guess
/// lets each client pick its address, to escape a per-address limit or to
/// lock a victim out. See the guide's
/// [Behind a tower layer](crate::guide#behind-a-tower-layer).
///
/// # Behind a proxy
///
/// A middleware that believes the header only from the proxies you name:
/// when the peer is one of them, the last entry of its `X-Forwarded-For`
/// (the address your proxy saw), else the peer. With a chain of proxies,
/// skip from the right one entry per trusted proxy behind the first.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use std::sync::Arc;
///
/// use axum::extract::{ConnectInfo, Request, State};
/// use axum::middleware::{self, Next};
/// use axum::response::Response;
/// use axum::{Extension, Router, body::Body, routing::get};
/// use platformkit_limit::layer::ClientIp;
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

/// The client's address: the request's [`ClientIp`] extension, else (with
/// the `axum` feature) axum's `ConnectInfo<SocketAddr>`; `None` when the
/// request carries neither. Never a header the client could write. For a
/// key function of your own (the address and the route together).
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
