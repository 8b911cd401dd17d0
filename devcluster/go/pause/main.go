// Command pause is the sandbox ("pause") process of the dev cluster's real node: it holds a
// pod's namespaces open, reaps the zombies of processes that end up parented to it (it is
// PID 1 of the pod's PID namespace when processes share it), and exits cleanly on SIGTERM or
// SIGINT. Written for TauGrid; it is built into a one-file image that containerd is told to
// use as its sandbox image, so nothing is ever pulled.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
