//! The ACME client's HTTP exchanges with the CA, each bounded in time and in size: the ACME
//! crate sets no limit of its own and reads every answer whole, so a CA (or anything between)
//! that accepts a connection and never answers, or answers without end, would otherwise hold the
//! renewal loop, and the name's lock, for as long as the process runs.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use instant_acme::{BodyWrapper, BytesResponse, Error, HttpClient};

/// One exchange with the CA, from the request to the last byte of the answer.
pub const EXCHANGE: Duration = Duration::from_secs(30);
/// The largest answer read: a directory, an order or a certificate chain is a few kilobytes.
pub const MOST: usize = 1 << 20;
/// The longest `Retry-After` passed on to the ACME crate. It adds the CA's delay to the clock
/// unchecked (a delay near `u64::MAX` seconds panics, and the task asking with it, the renewal
/// loop, dies); no CA means more than a day.
pub const MOST_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// `inner`'s exchanges under [`EXCHANGE`] and [`MOST`].
pub struct Bounded<C> {
    inner: C,
    within: Duration,
    most: usize,
}

impl<C> Bounded<C> {
    pub fn new(inner: C) -> Self {
        Self::with_limits(inner, EXCHANGE, MOST)
    }

    fn with_limits(inner: C, within: Duration, most: usize) -> Self {
        Bounded {
            inner,
            within,
            most,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One request's answer on its way.
pub type Answer<B> = Pin<Box<dyn Future<Output = Result<http::Response<B>, BoxError>> + Send>>;

/// A transport that answers one request (hyper's client; a test's stand-in).
pub trait Exchange: Send + Sync + 'static {
    type Body: http_body::Body<Data = Bytes, Error: std::error::Error + Send + Sync + 'static>
        + Send
        + 'static;
    fn send(&self, req: http::Request<BodyWrapper<Bytes>>) -> Answer<Self::Body>;
}

impl<C> Exchange for hyper_util::client::legacy::Client<C, BodyWrapper<Bytes>>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Body = hyper::body::Incoming;

    fn send(&self, req: http::Request<BodyWrapper<Bytes>>) -> Answer<Self::Body> {
        let fut = self.request(req);
        Box::pin(async move { fut.await.map_err(BoxError::from) })
    }
}

/// Why an exchange was cut.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("the CA did not answer within {0:?}")]
    Late(Duration),
    #[error("the CA's answer is larger than {0} bytes")]
    TooLarge(usize),
}

impl<C: Exchange> HttpClient for Bounded<C> {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, Error>> + Send>> {
        let sent = self.inner.send(req);
        let (within, most) = (self.within, self.most);
        Box::pin(async move {
            let whole = async {
                let resp = sent.await.map_err(Error::Other)?;
                let (mut parts, body) = resp.into_parts();
                sane_retry_after(&mut parts.headers, std::time::SystemTime::now());
                let body = Limited::new(body, most).collect().await.map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        Error::Other(Box::new(Cut::TooLarge(most)))
                    } else {
                        Error::Other(e)
                    }
                })?;
                let full = Full::new(body.to_bytes());
                Ok(BytesResponse::from(http::Response::from_parts(parts, full)))
            };
            tokio::time::timeout(within, whole)
                .await
                .unwrap_or_else(|_| Err(Error::Other(Box::new(Cut::Late(within)))))
        })
    }
}

/// Clamps a CA's `Retry-After` (delay-seconds or HTTP-date) to [`MOST_RETRY_AFTER`] from `now`,
/// and drops one that is neither (the ACME crate would ignore it).
fn sane_retry_after(headers: &mut http::HeaderMap, now: std::time::SystemTime) {
    let Some(value) = headers.get(http::header::RETRY_AFTER) else {
        return;
    };
    let most = MOST_RETRY_AFTER.as_secs();
    let text = value.to_str().unwrap_or("").trim();
    let secs = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Digits past u64 are a delay too, a long one.
        Some(text.parse::<u64>().unwrap_or(u64::MAX).min(most))
    } else {
        httpdate::parse_http_date(text)
            .ok()
            .map(|at| at.duration_since(now).map_or(0, |d| d.as_secs().min(most)))
    };
    match secs {
        Some(secs) => {
            headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        None => {
            headers.remove(http::header::RETRY_AFTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// Answers every request after `delay` with `body` bytes in chunks of 1,000; a body of
    /// `None` never ends.
    struct Canned {
        delay: Duration,
        body: Option<usize>,
    }

    type Chunks = http_body_util::StreamBody<
        futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>,
    >;

    impl Exchange for Canned {
        type Body = Chunks;

        fn send(&self, _req: http::Request<BodyWrapper<Bytes>>) -> Answer<Chunks> {
            use futures_util::StreamExt;
            let (delay, body) = (self.delay, self.body);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                let chunk = || Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 1000])));
                let stream = match body {
                    Some(n) => {
                        futures_util::stream::iter((0..n / 1000).map(move |_| chunk())).boxed()
                    }
                    // Bytes without end, a little at a time.
                    None => futures_util::stream::unfold((), move |()| async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((chunk(), ()))
                    })
                    .boxed(),
                };
                Ok(http::Response::new(http_body_util::StreamBody::new(stream)))
            })
        }
    }

    async fn fetch(c: Canned, within: Duration, most: usize) -> Result<usize, String> {
        let client = Bounded::with_limits(c, within, most);
        let req = http::Request::new(BodyWrapper::default());
        match client.request(req).await {
            Ok(mut resp) => {
                let body = resp.body.into_bytes().await.map_err(|e| e.to_string())?;
                Ok(body.len())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    #[tokio::test]
    async fn an_answer_within_the_limits_is_passed_on_whole() {
        let c = Canned {
            delay: Duration::ZERO,
            body: Some(5_000),
        };
        assert_eq!(fetch(c, Duration::from_secs(5), 10_000).await, Ok(5_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ca_that_never_answers_is_cut_at_the_limit() {
        let c = Canned {
            delay: Duration::from_secs(3600),
            body: Some(1_000),
        };
        let err = fetch(c, Duration::from_secs(30), MOST).await.unwrap_err();
        assert!(err.contains("did not answer within 30s"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_without_end_is_cut_by_size_or_time() {
        // Slowly, below the size limit: the time limit.
        let slow = Canned {
            delay: Duration::ZERO,
            body: None,
        };
        let err = fetch(slow, Duration::from_secs(30), MOST)
            .await
            .unwrap_err();
        assert!(err.contains("did not answer"), "{err}");
        // Past the size limit.
        let big = Canned {
            delay: Duration::ZERO,
            body: Some(50_000),
        };
        let err = fetch(big, Duration::from_secs(30), 10_000)
            .await
            .unwrap_err();
        assert!(err.contains("larger than 10000 bytes"), "{err}");
    }
}
