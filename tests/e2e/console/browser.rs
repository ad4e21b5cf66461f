//! A real browser: Debian's Chromium, headless, driven over WebDriver by its
//! ChromeDriver (`scripts/browser.sh` installs both the first time), through
//! the fantoccini client. Killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

pub struct Browser {
    pub client: Client,
    driver: Child,
    /// axe-core's source, injected into a page to audit it.
    axe: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// A new headless Chromium with a window of 1280 x 900.
    pub async fn start() -> Self {
        let out = Command::new(testkit::workspace_root().join("scripts/browser.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/browser.sh");
        assert!(
            out.status.success(),
            "scripts/browser.sh failed: no browser to test in"
        );
        let paths = String::from_utf8(out.stdout).unwrap();
        let mut paths = paths.lines();
        let (driver_path, chromium, axe) = (
            paths.next().unwrap(),
            paths.next().unwrap(),
            paths.next().unwrap(),
        );
        let axe = std::fs::read_to_string(axe).unwrap();
        let port = testkit::free_port();
        let driver = Command::new(driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning chromedriver");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                // --no-sandbox: the tests may run as root, where Chromium's
                // sandbox refuses to start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--disable-extensions", "--no-first-run"],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from chromedriver at {url}: {e}"),
            }
        };
        Self { client, driver, axe }
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// Types `text` into the field labelled `label` (by the label's text: the
    /// way a person finds it, and proof the field has a label).
    pub async fn fill(&self, label: &str, text: &str) {
        let id = self
            .client
            .find(Locator::XPath(&format!(
                "//label[contains(normalize-space(.), '{label}')]"
            )))
            .await
            .unwrap_or_else(|e| panic!("no field labelled `{label}`: {e}"))
            .attr("for")
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the label `{label}` names no field"));
        let field = self.client.find(Locator::Id(&id)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Clicks the button whose text contains `text`.
    /// Clicks the button whose text contains `text`, and waits until the
    /// page it submitted to has replaced this one.
    pub async fn press(&self, text: &str) {
        let button = self
            .client
            .find(Locator::XPath(&format!(
                "//button[contains(normalize-space(.), '{text}')]"
            )))
            .await;
        let button = match button {
            Ok(button) => button,
            Err(e) => panic!(
                "no button `{text}` on {}: {e}\n{}",
                self.url().await,
                self.text().await
            ),
        };
        button.click().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        // The old page's button goes stale once the next page is loaded.
        while button.tag_name().await.is_ok() {
            assert!(Instant::now() < deadline, "pressing `{text}` loaded no page");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Presses and releases `key` on the keyboard, wherever the focus is.
    pub async fn key(&self, key: Key) {
        use fantoccini::actions::{InputSource as _, KeyAction, KeyActions};
        let value = char::from(key);
        let keys = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value })
            .then(KeyAction::Up { value });
        self.client.perform_actions(keys).await.unwrap();
    }

    /// What has the focus: its id, or else its text.
    pub async fn focused(&self) -> String {
        self.eval("return document.activeElement.id || document.activeElement.textContent.trim()")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        self.client
            .find(Locator::Css("body"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The page's whole text, what is folded away (`<details>`) included.
    pub async fn all_text(&self) -> String {
        self.eval("return document.body.textContent")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn url(&self) -> String {
        self.client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default()
    }

    /// Runs `script` in the page (WebDriver's own channel, which the page's
    /// Content-Security-Policy does not govern) and returns its value.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// What axe-core finds wrong with the page against WCAG 2.1 A and AA and
    /// its best practices (labels, contrast, headings, landmarks, names...):
    /// each violated rule, its help text and how many elements break it.
    pub async fn accessibility_violations(&self) -> Vec<String> {
        self.eval(&self.axe).await;
        let found = self
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}})
                    .then(r => done(r.violations.map(v => `${v.id}: ${v.help} (${v.nodes.length}: ${v.nodes.map(n => n.html).join(' | ').slice(0, 300)})`)))
                    .catch(e => done([`axe failed: ${e}`]));",
                vec![],
            )
            .await
            .unwrap();
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}
