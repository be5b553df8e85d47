//! The TCP origin behind the `[[tcp]]` relay: echoes every byte back, and can be killed and restarted
//! on the same port like the HTTP origins.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub struct Echo {
    pub addr: SocketAddr,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Echo {
    pub async fn start() -> Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let echo = Arc::new(Echo {
            addr: listener.local_addr()?,
            task: Mutex::new(None),
        });
        echo.spawn(listener);
        Ok(echo)
    }

    fn spawn(&self, listener: TcpListener) {
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    r = listener.accept() => if let Ok((mut s, _)) = r {
                        conns.spawn(async move {
                            let (mut rd, mut wr) = s.split();
                            let _ = tokio::io::copy(&mut rd, &mut wr).await;
                        });
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        *self.task.lock().unwrap() = Some(task);
    }

    pub fn kill(&self) {
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
    }

    pub async fn restart(&self) -> Result<()> {
        for _ in 0..50 {
            if let Ok(l) = TcpListener::bind(self.addr).await {
                self.spawn(l);
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        TcpListener::bind(self.addr)
            .await
            .map(|_| ())
            .context("rebinding the echo origin")
    }
}
