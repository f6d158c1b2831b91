package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// What the two benchmark commands (bench/cmd) share.

// AzuriteFromEnv sets endpoint and key from $BLOBFS_TEST_AZURITE and
// $BLOBFS_TEST_AZURITE_KEY when they are set: the variables the tests and
// .ci/azurite.sh use.
func AzuriteFromEnv(endpoint, key *string) {
	if v := os.Getenv("BLOBFS_TEST_AZURITE"); v != "" {
		*endpoint = v
	}
	if v := os.Getenv("BLOBFS_TEST_AZURITE_KEY"); v != "" {
		*key = v
	}
}

// WriteReport writes a report's markdown to standard output and, when out
// is not empty, to the file out as well.
func WriteReport(markdown func(io.Writer) error, out string) error {
	if out == "" {
		return markdown(os.Stdout)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	err = markdown(io.MultiWriter(os.Stdout, f))
	return errors.Join(err, f.Close())
}

// ParseFlags parses a benchmark command's arguments into its config C and
// options O. It parses twice: first to learn whether -quick (isQuick) picks
// the other set of defaults (defaults), then for real over those, with
// Azurite's endpoint and key from the environment (azurite) in between, so
// that any flag given still wins. Arguments that are not flags are an
// error.
func ParseFlags[C, O any](args []string, defaults func(quick bool) C, newFlags func(*C, *O) *flag.FlagSet, isQuick func(*O) bool, azurite func(*C)) (C, O, error) {
	var o O
	c := defaults(false)
	if err := newFlags(&c, &o).Parse(args); err != nil {
		return c, o, err
	}
	c, o = defaults(isQuick(&o)), *new(O)
	azurite(&c)
	fl := newFlags(&c, &o)
	if err := fl.Parse(args); err != nil {
		return c, o, err
	}
	if fl.NArg() > 0 {
		return c, o, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	return c, o, nil
}
