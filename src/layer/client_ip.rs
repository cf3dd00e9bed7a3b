//! [`ClientIp`]: the client's address, as something that knows the
//! deployment resolved it.

use std::net::IpAddr;

use http::request::Parts;

/// The client's address, resolved before the layer by something that knows
/// how this service is deployed, and put in the request's extensions: the
/// address [`client_ip`] and
/// [`LimitLayer::limit_per_client_ip`](super::LimitLayer::limit_per_client_ip)
/// read first.
///
/// # Why the library never reads `X-Forwarded-For`
///
/// `X-Forwarded-For` (and `Forwarded`, `X-Real-IP`) is a header any client
/// can send: it holds what the client wrote, followed by what each proxy
/// on the way appended. Only the entries your own proxies appended can be
/// trusted, and which entry that is (which hop to trust) depends on how
/// many proxies stand in front of the service and which peers they are: a
/// fact of the deployment that only the service knows. A library that
/// guesses, commonly by taking the first entry, lets every client write
/// its own address: a new one on each request, escaping every per-address
/// limit, or a victim's, locking the victim out. So the address comes from
/// what resolved it knowing the deployment:
///
/// - the peer address of the connection, when clients connect directly:
///   with the `axum` feature, axum's `ConnectInfo<SocketAddr>` (serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`) is read when no
///   `ClientIp` is set;
/// - behind proxies, a middleware of yours (below), or a crate configured
///   with the header your own proxy sets (such as `axum-client-ip`), that
///   inserts a `ClientIp` before the layer.
///
/// # Behind a proxy
///
/// A middleware that believes the header only from the proxies you name:
/// when the connection's peer is one of them, the last entry of its
/// `X-Forwarded-For` (the address your proxy saw), else the peer itself,
/// so a client that connects directly and sends the header changes
/// nothing. With a chain of proxies, skip from the right one entry per
/// trusted proxy behind the first. A trusted proxy that sends no usable
/// header leaves the proxy's own address: one key for everyone behind it,
/// the strict side.
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
///
/// Set by hand:
///
/// ```
/// use axum::http::Request;
/// use platformkit_limit::layer::{ClientIp, client_ip};
/// use std::net::{IpAddr, Ipv4Addr};
///
/// let address = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
/// let request = Request::get("/").extension(ClientIp(address)).body(())?;
/// let (head, _) = request.into_parts();
/// assert_eq!(client_ip(&head), Some(address));
/// # Ok::<(), axum::http::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientIp(pub IpAddr);

/// The client's address: the request's [`ClientIp`] extension, else (with
/// the `axum` feature) axum's `ConnectInfo<SocketAddr>`; `None` when the
/// request carries neither. Never a header the client could write (see
/// [`ClientIp`]).
///
/// For a key function of your own, such as the address and the route
/// together. A rule that must never let an address-less request through
/// unlimited is
/// [`LimitLayer::limit_per_client_ip`](super::LimitLayer::limit_per_client_ip).
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
