//! A minimal client of PostgreSQL's wire protocol, for pipelines:
//! tokio-postgres sends a Sync after every statement, and what these tests
//! need is several statements before one Sync. Trust authentication only
//! (the harness's throwaway servers).

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::IsNull;
use postgres_protocol::message::backend::{ErrorResponseBody, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// What one statement of a pipeline answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// It ran: its rows, in text format.
    Rows(Vec<Vec<Option<String>>>),
    /// It failed: the SQLSTATE and the message.
    Error(String, String),
    /// An earlier statement failed, so the server skipped it.
    Skipped,
}

pub struct Wire {
    stream: TcpStream,
    read: BytesMut,
}

impl Wire {
    /// StartupMessage, then everything up to ReadyForQuery.
    pub async fn connect(config: &Config) -> Wire {
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            other => panic!("the wire-protocol client needs a TCP host, not {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let stream = TcpStream::connect((host.as_str(), port))
            .await
            .unwrap_or_else(|e| panic!("connecting to {host}:{port}: {e}"));
        let mut wire = Wire {
            stream,
            read: BytesMut::new(),
        };
        let mut out = BytesMut::new();
        frontend::startup_message(
            [
                ("user", config.get_user().expect("a user")),
                ("database", config.get_dbname().expect("a database")),
                ("client_encoding", "UTF8"),
            ],
            &mut out,
        )
        .unwrap();
        wire.send(&out).await;
        loop {
            match wire.next().await {
                Message::AuthenticationOk
                | Message::ParameterStatus(_)
                | Message::BackendKeyData(_)
                | Message::NoticeResponse(_) => {}
                Message::ReadyForQuery(_) => return wire,
                Message::ErrorResponse(body) => {
                    panic!("the server refused the connection: {:?}", error(&body))
                }
                _ => panic!(
                    "the server asked for more than trust authentication, which is all \
                     this test's wire-protocol client speaks"
                ),
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("writing");
    }

    async fn next(&mut self) -> Message {
        loop {
            if let Some(message) = Message::parse(&mut self.read).expect("a backend message") {
                return message;
            }
            let n = self.stream.read_buf(&mut self.read).await.expect("reading");
            assert!(n > 0, "the server closed the connection");
        }
    }

    /// Parse, Bind and Execute of each statement (no parameters, text
    /// results), then one Sync: one implicit transaction. Returns each
    /// statement's answer and the transaction status of the
    /// ReadyForQuery that ends it (`b'I'`: idle).
    pub async fn pipeline(&mut self, statements: &[&str]) -> (Vec<Answer>, u8) {
        let mut out = BytesMut::new();
        for sql in statements {
            frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
            if frontend::bind(
                "",
                "",
                std::iter::empty(),
                std::iter::empty::<()>(),
                |(), _| Ok(IsNull::Yes),
                std::iter::empty(),
                &mut out,
            )
            .is_err()
            {
                panic!("encoding Bind");
            }
            frontend::execute("", 0, &mut out).unwrap();
        }
        frontend::sync(&mut out);
        self.send(&out).await;

        let mut answers = Vec::new();
        let mut rows = Vec::new();
        let status = loop {
            match self.next().await {
                Message::ParseComplete
                | Message::BindComplete
                | Message::NoticeResponse(_)
                | Message::ParameterStatus(_) => {}
                Message::DataRow(row) => {
                    let values = row
                        .ranges()
                        .map(|range| {
                            Ok(range
                                .map(|r| String::from_utf8_lossy(&row.buffer()[r]).into_owned()))
                        })
                        .collect()
                        .expect("a data row");
                    rows.push(values);
                }
                Message::CommandComplete(_) => {
                    answers.push(Answer::Rows(std::mem::take(&mut rows)));
                }
                Message::ErrorResponse(body) => {
                    let (code, message) = error(&body);
                    answers.push(Answer::Error(code, message));
                }
                Message::ReadyForQuery(ready) => break ready.status(),
                _ => panic!("an unexpected message in a pipeline's answer"),
            }
        };
        while answers.len() < statements.len() {
            answers.push(Answer::Skipped);
        }
        (answers, status)
    }
}

/// The SQLSTATE and message of an ErrorResponse.
fn error(body: &ErrorResponseBody) -> (String, String) {
    let (mut code, mut message) = (String::new(), String::new());
    let mut fields = body.fields();
    while let Some(field) = fields.next().expect("error fields") {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    (code, message)
}
