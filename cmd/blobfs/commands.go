package main

// The command tree: cobra commands with pflag flags, as kubectl, helm,
// rclone and blobfuse2 have them. Each command's flags are declared by its
// register function (registerMountFlags, registerCSIFlags, ...), which
// docs_test.go also reads to check docs/reference.md.
//
// A mistake on the command line is one line, with the command's usage and
// a pointer to its --help, and exit status 2 (usageError): the full usage
// runs to 60 lines and would hide the mistake.
//
// Scripts, fstab lines and running supervisors written for the Go flag
// package pass long flags with one dash (-container x); normalizeArgs
// gives them their second dash before cobra parses them.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/blobfs/blobfs/csi"
)

// newRootCommand builds `blobfs` and its commands, each with its flags
// bound to a fresh configuration.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "blobfs",
		Short: "blobfs mounts an Azure Blob Storage container as a POSIX filesystem",
		Long: "blobfs mounts an Azure Blob Storage container (or a local directory standing in for one)\n" +
			"as a POSIX filesystem, and is the Kubernetes CSI driver that mounts it in pods.\n\n" +
			"Installed as mount.blobfs, it is the helper mount(8) and /etc/fstab call:\n" +
			"  mount.blobfs SOURCE MOUNTPOINT [-o OPTIONS]",
		Version: version,
		// The commands print their errors through main, which picks the
		// exit status; a mistake is not answered with the whole usage.
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q (see blobfs --help)", args[0])}
			}
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			return usageError{fmt.Errorf("a command is needed: %s (see blobfs --help)", strings.Join(names, ", "))}
		},
	}
	root.SetVersionTemplate("blobfs {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%s: %v (usage: %s; see %s --help)", cmd.Name(), err, cmd.UseLine(), cmd.CommandPath())}
	})
	root.AddCommand(
		mountCommand(),
		unmountCommand(),
		csiCommand(),
		keeperCommand(),
		registrarCommand(),
		workerCommand(),
		&cobra.Command{
			Use:   "version",
			Short: "Print blobfs's version (as blobfs --version does)",
			Args:  noArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprintln(cmd.OutOrStdout(), "blobfs", version)
			},
		},
	)
	return root
}

// noArgs refuses arguments to a command that takes none, in one line.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) != 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q (see %s --help)", cmd.Name(), args, cmd.CommandPath())}
	}
	return nil
}

func mountCommand() *cobra.Command {
	c := newMountConfig()
	cmd := &cobra.Command{
		Use:   "mount [flags] MOUNTPOINT",
		Short: "Mount a container (in the background unless --foreground)",
		Long: "Mount an Azure Blob Storage container, or a local directory standing in for one, at MOUNTPOINT.\n" +
			"In the background (the default) a supervisor holds the mount and restarts the process serving it if it dies.",
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMount(c, cmd.Flags(), args)
		},
	}
	registerMountFlags(cmd.Flags(), c)
	return cmd
}

// workerCommand is the hidden `blobfs mount-worker`, which a background
// mount's supervisor runs with the mount's flags (supervise.go).
func workerCommand() *cobra.Command {
	c := newMountConfig()
	cmd := &cobra.Command{
		Use:    workerMode + " [flags] MOUNTPOINT",
		Short:  "Serve a background mount for its supervisor (not run by hand)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMountWorker(c, cmd.Flags(), args)
		},
	}
	registerMountFlags(cmd.Flags(), c)
	return cmd
}

func unmountCommand() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:     "unmount [-z] MOUNTPOINT",
		Aliases: []string{"umount"},
		Short:   "Unmount a blobfs mount",
		// -z is the only flag besides --help.
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("unmount needs exactly one MOUNTPOINT (see blobfs unmount --help)")}
			}
			return unmountPath(args[0], lazy)
		},
	}
	cmd.Flags().BoolVarP(&lazy, "lazy", "z", false, "detach now even if busy (umount -l)")
	return cmd
}

func csiCommand() *cobra.Command {
	var f csiFlags
	cmd := &cobra.Command{
		Use:   "csi [flags]",
		Short: "Run the Kubernetes CSI driver",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCSI(f)
		},
	}
	registerCSIFlags(cmd.Flags(), &f)
	return cmd
}

func keeperCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keeper --socket PATH [flags]",
		Short: "Hold the CSI driver's FUSE mounts across its restarts",
		Args:  noArgs,
	}
	socket, logs := registerKeeperFlags(cmd.Flags())
	cmd.RunE = func(*cobra.Command, []string) error {
		return runKeeper(socket, logs)
	}
	return cmd
}

func registrarCommand() *cobra.Command {
	var cfg csi.RegistrarConfig
	var logs logFlags
	cmd := &cobra.Command{
		Use:   "registrar [flags]",
		Short: "Register the CSI node plugin with kubelet",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			return runRegistrar(cfg, logs)
		},
	}
	registerRegistrarFlags(cmd.Flags(), &cfg, &logs)
	return cmd
}

// normalizeArgs gives the long flags of args (the command line after
// "blobfs") their second dash, as Go's flag package took them with one:
// "-container x" and "-read-only=false" become "--container x" and
// "--read-only=false". A single dash stays where it begins a shorthand
// (-z, -h); the values of flags, and everything after "--", are left
// alone.
func normalizeArgs(root *cobra.Command, args []string) []string {
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	fl, rest := root.Flags(), args
	if len(args) > 0 {
		if cmd, _, err := root.Find(args[:1]); err == nil && cmd != root {
			cmd.InitDefaultHelpFlag()
			fl, rest = cmd.Flags(), args[1:]
		}
	}
	out := append([]string(nil), args[:len(args)-len(rest)]...)
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			return append(out, rest[i:]...)
		}
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(a) > 2 {
			name, _, _ := strings.Cut(a[1:], "=")
			if name != "" && (fl.Lookup(name) != nil || fl.ShorthandLookup(name[:1]) == nil) {
				a = "-" + a
			}
		}
		out = append(out, a)
		// A flag that takes a value and was given without "=" takes the
		// next argument, whatever it looks like (--kernel-readahead-kb -1).
		if name, ok := strings.CutPrefix(a, "--"); ok && !strings.Contains(name, "=") {
			if f := fl.Lookup(name); f != nil && f.NoOptDefVal == "" && i+1 < len(rest) {
				i++
				out = append(out, rest[i])
			}
		}
	}
	return out
}
