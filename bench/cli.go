package bench

import (
	"errors"
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
