# Sourced by the benchmark scripts: an sshd and ssh client of our own with throwaway
# keys (see /work/shared/docs/peers.md).
#
# throwaway_ssh DIR ADDR PORT: keys (kept when DIR already has them), DIR/sshd_config
# listening on ADDR:PORT, and DIR/ssh_config with the host alias `bench`. Start the
# server with `sshd -f DIR/sshd_config`; connect with `ssh -F DIR/ssh_config bench`.
throwaway_ssh() {
    local dir=$1 addr=$2 port=$3
    mkdir -p "$dir" /run/sshd
    [[ -f $dir/host_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
    [[ -f $dir/client_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/client_key"
    cp "$dir/client_key.pub" "$dir/authorized_keys"
    cat >"$dir/sshd_config" <<CONF
Port $port
ListenAddress $addr
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
StrictModes no
PidFile $dir/sshd.pid
Subsystem sftp internal-sftp
CONF
    cat >"$dir/ssh_config" <<CONF
Host bench
    HostName $addr
    Port $port
    User $(id -un)
    IdentityFile $dir/client_key
    StrictHostKeyChecking no
    UserKnownHostsFile $dir/known_hosts
    LogLevel ERROR
CONF
}
