//! [`ClientIp`]: the client's address, as something that knows the
//! deployment resolved it.

use std::net::IpAddr;

use http::request::Parts;

/// The client's address, resolved before the layer by something that knows
/// how this service is deployed, and put in the request's extensions: the
/// address [`client_ip`] and
/// [`LimitLayer::limit_per_client_ip`](crate::LimitLayer::limit_per_client_ip)
/// read first.
///
/// # Why the layer never reads `X-Forwarded-For`
///
/// `X-Forwarded-For` (and `Forwarded`, `X-Real-IP`) holds what the client
/// sent, followed by what each proxy on the way appended. Only the entries
/// your own proxies appended can be trusted, and which entry that is depends
/// on how many proxies stand in front of the service: something only the
/// deployment knows. A library that guesses, commonly by taking the first
/// entry, lets every client write its own address: a new one on each
/// request, escaping every per-address limit, or a victim's, locking the
/// victim out. So the address comes from what resolved it knowing the
/// deployment:
///
/// - the peer address of the connection, when clients connect directly:
///   with the `axum` feature, axum's `ConnectInfo<SocketAddr>` (serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`) is read when no
///   `ClientIp` is set;
/// - behind proxies, a middleware of yours, or a crate configured with the
///   header your own proxy sets (such as `axum-client-ip`), that inserts a
///   `ClientIp` before the layer.
///
/// ```
/// use axum::http::Request;
/// use platformkit_limit::{ClientIp, client_ip};
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
/// [`LimitLayer::limit_per_client_ip`](crate::LimitLayer::limit_per_client_ip).
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
