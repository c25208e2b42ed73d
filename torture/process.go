package torture

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"time"
)

// Replica is one gateway process on a fixed address, so that it can be
// killed and restarted under the workers' feet.
type Replica struct {
	Index int
	Addr  string // host:port, the same across restarts

	bin  string
	args []string
	log  io.Writer
	// netns, if set, is the network namespace the replica runs in (the
	// partition fault); args then name the host by its veth address.
	netns *netns
	// joinDisk, if set, is called with each started process's id (the
	// stall-disk fault's SlowDisk.Join).
	joinDisk func(pid int) error

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

var servingLine = regexp.MustCompile(`serving on http://(\S+)`)

// freeAddr returns a 127.0.0.1 address that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// URL is the replica's base URL.
func (r *Replica) URL() string { return "http://" + r.Addr }

// Start runs the gateway and waits until it serves.
func (r *Replica) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	name, args := r.bin, append([]string{"serve", "--listen", r.Addr}, r.args...)
	if r.netns != nil {
		name, args = r.netns.command(name, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Stderr = r.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start gateway %d: %w", r.Index, err)
	}
	if r.joinDisk != nil {
		if err := r.joinDisk(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("gateway %d on the slow disk: %w", r.Index, err)
		}
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.OnceFunc(func() { close(ready) })
		for sc.Scan() {
			fmt.Fprintf(r.log, "[gw%d] %s\n", r.Index, sc.Text())
			if servingLine.MatchString(sc.Text()) {
				once()
			}
		}
	}()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-ready:
	case <-exited:
		return fmt.Errorf("gateway %d exited at start (see its log)", r.Index)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("gateway %d did not serve within 30s", r.Index)
	}
	r.cmd, r.exited, r.paused = cmd, exited, false
	return nil
}

// PID is the running process's id (0 if none).
func (r *Replica) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process to die.
func (r *Replica) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.cmd = nil
}

// Pause sends SIGSTOP, Resume SIGCONT.
func (r *Replica) Pause() { r.signal(syscall.SIGSTOP, true) }

// Resume continues a paused replica; it is safe to call at any time.
func (r *Replica) Resume() { r.signal(syscall.SIGCONT, false) }

func (r *Replica) signal(sig syscall.Signal, paused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
		r.paused = paused
	}
}

// Alive reports whether the process is running (it may be paused).
func (r *Replica) Alive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Stop ends the replica for good: SIGCONT, then SIGTERM, then SIGKILL.
func (r *Replica) Stop() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

var errNoBinary = errors.New("no gateway binary")

// lockedWriter serialises writes of several processes to one log.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// openLog opens path for appending.
func openLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}
