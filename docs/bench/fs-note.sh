# Sourced by the bench scripts that delete many files when they end (ab-push.sh,
# tune-cells.sh). ext4 without a journal passes over inodes freed in the last one to
# six minutes when it creates files (`recently_deleted`; docs/benchmarks.md, "Tiny at
# short RTTs"), so the copies such a script deletes slow the next runs there.

# note_recently_deleted DIR: says so on stderr when DIR is on ext4 without a journal.
note_recently_deleted() {
    local dev
    dev=$(findmnt -no SOURCE -T "$1" 2>/dev/null || true)
    if [ "$(findmnt -no FSTYPE -T "$1" 2>/dev/null || true)" = ext4 ] &&
        [ "$(cat "/sys/fs/ext4/${dev##*/}/journal_task" 2>/dev/null || true)" = "<none>" ]; then
        echo "note: $1 is on ext4 without a journal: runs started within 6 minutes of" \
            "deleting many files there are slowed (recently_deleted), and this script" \
            "deletes its copies when it ends" >&2
    fi
}
