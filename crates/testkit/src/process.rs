//! A server process as scripts start it: it announces itself with one line
//! on stdout (`simulator downstream`, `simulator proxy`) and stops on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStdout, Command};

pub struct AnnouncingProcess {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl AnnouncingProcess {
    /// Spawns `command` (stdout and stderr piped, killed on drop) and reads
    /// its first stdout line, which must come within 10 s.
    pub async fn spawn(mut command: Command) -> (Self, String) {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(10), stdout.read_line(&mut line))
            .await
            .expect("the listening line in time")
            .unwrap();
        (Self { child, stdout }, line)
    }

    /// SIGTERM: the process must exit 0 within 5 s, having printed nothing
    /// on stdout after its first line. Returns its stderr (the logs).
    pub async fn terminate(mut self) -> String {
        let pid = self.child.id().unwrap().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .expect("stops within 5 s")
            .unwrap();
        assert!(status.success(), "{status:?}");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "", "stdout carries the listening line alone");
        let mut logs = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut logs)
            .await
            .unwrap();
        logs
    }
}
