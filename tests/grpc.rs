//! A gRPC service behind the layer: a refused call is a status a gRPC
//! client reads (`RESOURCE_EXHAUSTED`, with `retry-after` in its metadata),
//! never an HTTP answer it cannot.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use platformkit_limit::{Key, Limiter, Memory};
use platformkit_limit_tower::LimitLayer;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

use crate::common::limit;

#[derive(Clone, PartialEq, prost::Message)]
struct Ping {
    #[prost(string, tag = "1")]
    name: String,
}

/// A unary `Echo/Ping`, written as tonic's generated code writes it.
#[derive(Clone)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "Echo";
}

/// The method's handler.
struct EchoPing;

impl UnaryService<Ping> for EchoPing {
    type Response = Ping;
    type Future = BoxFuture<'static, Result<Response<Ping>, Status>>;

    fn call(&mut self, request: Request<Ping>) -> Self::Future {
        Box::pin(async move {
            let ping = request.into_inner();
            if ping.name == "wrong" {
                return Err(Status::unauthenticated("wrong password"));
            }
            Ok(Response::new(ping))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<Ping, Ping>::default());
            Ok(grpc.unary(EchoPing, request).await)
        })
    }
}

async fn ping(channel: Channel, api_key: &str) -> Result<Ping, Status> {
    call(channel, api_key, "hi").await
}

async fn call(channel: Channel, api_key: &str, name: &str) -> Result<Ping, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.expect("ready");
    let mut request = Request::new(Ping { name: name.into() });
    request
        .metadata_mut()
        .insert("x-api-key", api_key.parse().expect("ascii"));
    client
        .unary(
            request,
            "/Echo/Ping".parse().expect("a path"),
            ProstCodec::<Ping, Ping>::default(),
        )
        .await
        .map(Response::into_inner)
}

#[tokio::test]
async fn a_refused_grpc_call_is_resource_exhausted_with_retry_after() {
    let quota = limit("grpc", 2);
    let layer = LimitLayer::hit(Limiter::new(Memory::new()))
        .require(&quota, |parts| {
            let key = parts.headers.get("x-api-key")?.to_str().ok()?;
            Some(Key::opaque(key))
        })
        .grpc();
    let channel = serve(layer).await;

    for _ in 0..2 {
        assert_eq!(
            ping(channel.clone(), "client-1")
                .await
                .expect("allowed")
                .name,
            "hi"
        );
    }
    let refused = ping(channel.clone(), "client-1")
        .await
        .expect_err("the third call is over the quota");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.metadata().get("retry-after").is_some(),
        "{refused:?}"
    );
    // Another client has a quota of its own; a call without the key is
    // INVALID_ARGUMENT, not a limit's refusal.
    assert!(ping(channel.clone(), "client-2").await.is_ok());
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.expect("ready");
    let keyless = client
        .unary(
            Request::new(Ping::default()),
            "/Echo/Ping".parse().expect("a path"),
            ProstCodec::<Ping, Ping>::default(),
        )
        .await
        .expect_err("no key");
    assert_eq!(keyless.code(), Code::InvalidArgument, "{keyless:?}");
}

/// In `attempt` mode, a call that fails with a gRPC status is a failure
/// although its HTTP status is 200: it counts, and a success is taken back.
#[tokio::test]
async fn in_attempt_mode_a_failed_grpc_call_counts_and_a_success_is_taken_back() {
    let guesses = limit("grpc-login", 2);
    let layer = LimitLayer::attempt(
        Limiter::new(Memory::new()),
        |response: &http::response::Parts| response.status.is_success(),
    )
    .require(&guesses, |parts| {
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        Some(Key::opaque(key))
    })
    .grpc();
    let channel = serve(layer).await;
    for _ in 0..5 {
        call(channel.clone(), "alice", "right")
            .await
            .expect("taken back");
    }
    for _ in 0..2 {
        let wrong = call(channel.clone(), "alice", "wrong")
            .await
            .expect_err("wrong");
        assert_eq!(wrong.code(), Code::Unauthenticated, "{wrong:?}");
    }
    let refused = call(channel, "alice", "right")
        .await
        .expect_err("two failures fill the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
}

/// Serves `Echo` behind `layer` on a free port; a channel to it.
async fn serve<L>(layer: L) -> Channel
where
    L: tower::Layer<tonic::service::Routes> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(Echo)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    Channel::from_shared(format!("http://{address}"))
        .expect("a uri")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connected")
}

/// The listener's connections, as tonic's server takes them.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}
