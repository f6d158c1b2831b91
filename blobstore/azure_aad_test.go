package blobstore

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestAzureADChainErrorIsOneLine: a configuration without credentials
// authenticates with Azure AD's default chain; on a machine where no
// credential of the chain works, the error says so in one line that names
// what was tried and what to give instead, not the SDK's paragraph (1,064
// characters on this project's machines), and the mount says at start
// which authentication it uses.
func TestAzureADChainErrorIsOneLine(t *testing.T) {
	sdk := "DefaultAzureCredential: failed to acquire a token.\nAttempted credentials:\n" +
		"\tEnvironmentCredential: missing environment variable AZURE_TENANT_ID\n" +
		"\tWorkloadIdentityCredential: no client ID specified. Check pod configuration or set ClientID in the options\n" +
		"\tManagedIdentityCredential: managed identity timed out. See https://aka.ms/azsdk/go/identity/troubleshoot#dac for more information\n" +
		"\tAzureCLICredential: Azure CLI not found on path\n" +
		"\tAzureDeveloperCLICredential: Azure Developer CLI not found on path\n" +
		"\tTo troubleshoot, visit https://aka.ms/azsdk/go/identity/troubleshoot/defaultazurecredential"
	got := (&tokenError{errors.New(sdk)}).Error()
	if strings.Contains(got, "\n") || len(got) > 600 {
		t.Errorf("token error is %d characters over %d lines, want one short line:\n%s", len(got), strings.Count(got, "\n")+1, got)
	}
	for _, want := range []string{"EnvironmentCredential", "ManagedIdentityCredential (managed identity timed out)", "AzureCLICredential", "account key"} {
		if !strings.Contains(got, want) {
			t.Errorf("token error %q lacks %q", got, want)
		}
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	NoteAuthMode(log, AzureConfig{Account: "acct", Container: "data"})
	if !strings.Contains(buf.String(), "authenticating with Azure AD") {
		t.Errorf("a mount without credentials does not say it uses Azure AD: %q", buf.String())
	}
	buf.Reset()
	NoteAuthMode(log, AzureConfig{Account: "acct", Container: "data", Key: "a2V5"})
	if buf.Len() != 0 {
		t.Errorf("a mount with an account key said: %q", buf.String())
	}
}
