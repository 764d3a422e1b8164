//! `dmover mount --rw`'s rename, the server's part ([`Op::Rename`], docs/remote.md):
//! one rename(2) of an entry to another path of the same export, with the user's write
//! rights, both sides confined beneath the export as a push's destination is.

use dmover_proto::control::{Rename, Summary};

use super::*;

impl Server {
    /// [`Op::Rename`]: checks the rights on both paths (the user needs write rights on a
    /// writable export), renames with [`paths::rename_beneath`] and answers
    /// [`Control::Done`] with an empty summary.
    pub(super) async fn rename<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: Rename,
        log: &mut SessionLog,
    ) -> Result<()> {
        self.options(ch).await?;
        if grant.scope.is_some() {
            return Err(refused(
                ErrorCode::PermissionDenied,
                "a third-party capability does not allow renaming",
            ));
        }
        let policy = self.policy.borrow().clone();
        let read_only = self.cfg.read_only;
        let (from_export, from_base, from, _) =
            policy.resolve(read_only, grant, &req.from, true)?;
        let (to_export, to_base, to, _) = policy.resolve(read_only, grant, &req.to, true)?;
        if from_export.name != to_export.name {
            return Err(refused(
                ErrorCode::Unsupported,
                format!(
                    "renaming {:?} to {:?}: not within one export",
                    String::from_utf8_lossy(&req.from),
                    String::from_utf8_lossy(&req.to)
                ),
            ));
        }
        log.what = format!(
            "rename of {:?} to {:?}",
            String::from_utf8_lossy(&req.from),
            String::from_utf8_lossy(&req.to)
        );
        let (from, to) = (from.to_vec(), to.to_vec());
        self.disk
            .run(move || paths::rename_beneath(&from_base, &from, &to_base, &to))
            .await
            .ok_or(Error::Aborted)??;
        tracing::info!(
            "{}: renamed {:?} to {:?} for user {:?}",
            ch.peer(),
            String::from_utf8_lossy(&req.from),
            String::from_utf8_lossy(&req.to),
            grant.user
        );
        ch.send(&Control::Done(Summary::default())).await?;
        Ok(())
    }
}
