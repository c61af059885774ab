"""What both HTTP transports (REST in app/rest/, GraphQL in schema/) share."""
