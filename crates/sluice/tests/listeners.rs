//! Named listeners (`[[server.listeners]]`): built-ins moved with `endpoints.listener` answer only
//! there, user routes stay on `main` unless they name another listener; under both runtime models.

mod reverse_support;

use std::time::Duration;

use reverse_support::*;
use sluice::runtime::RuntimeModel;
use sluice::server::Server;

/// Starts sluice with `Server::bind` (named listeners need it) and returns the bound addresses by
/// listener name, with the stop handle.
async fn start(
    text: &str,
    model: RuntimeModel,
) -> (
    std::collections::HashMap<String, std::net::SocketAddr>,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut config = sluice::config::Config::parse_file(text).unwrap();
    config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.server.runtime = model;
    config.server.threads = 2;
    config.validate().unwrap();
    let app = sluice::app::App::new(&config).unwrap();
    let server = Server::bind(&config.server, app).unwrap();
    let bound = server.bound().into_iter().collect();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    (bound, tx)
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(r.body.as_ref().unwrap()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_on_the_admin_listener() {
    let app = echo("app").await;
    let internal = echo("internal").await;
    let config = format!(
        r#"
[[server.listeners]]
name = "admin"
listen = ["127.0.0.1:0"]

[[server.listeners]]
name = "internal"
listen = ["127.0.0.1:0"]

[endpoints]
listener = "admin"

[[upstreams]]
name = "app"
servers = ["{app}"]

[[upstreams]]
name = "internal"
servers = ["{internal}"]

[[routes]]
path = "/api/"
upstream = "app"

[[routes]]
path = "/"
upstream = "internal"
listener = "internal"
"#
    );
    for model in [RuntimeModel::WorkStealing, RuntimeModel::PerCore] {
        let (bound, stop) = start(&config, model).await;
        let (main, admin, inner) = (bound["main"], bound["admin"], bound["internal"]);
        assert!(main != admin && admin != inner);
        // On admin: the built-ins, nothing else.
        let m = get(&format!("http://{admin}/metrics"), &[]).await;
        assert_eq!(m.status, 200, "{model:?}");
        assert!(
            text(&m).contains("# TYPE sluice_requests counter")
                || text(&m).contains("# TYPE sluice_requests_total counter"),
            "{}",
            text(&m)
        );
        assert_eq!(
            get(&format!("http://{admin}/health"), &[]).await.status,
            200
        );
        let r = get(&format!("http://{admin}/api/x"), &[]).await;
        assert_eq!(r.status, 404, "{model:?}: a user route answered on admin");
        // On main: the user route, and no built-in.
        let r = get(&format!("http://{main}/api/x"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-origin"], "app");
        for path in ["/metrics", "/health", "/status"] {
            let r = get(&format!("http://{main}{path}"), &[]).await;
            assert_eq!(r.status, 404, "{model:?}: {path} answered on main");
            assert!(!text(&r).contains("sluice_"), "{}", text(&r));
        }
        // A route naming a listener lives only there.
        let r = get(&format!("http://{inner}/metrics"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-origin"], "internal");
        assert_eq!(get(&format!("http://{main}/other"), &[]).await.status, 404);
        let _ = stop.send(());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
