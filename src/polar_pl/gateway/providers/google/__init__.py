"""Google generateContent (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent`)."""
